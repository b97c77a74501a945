"""Cache policy: which gids rank r keeps in its device feature cache (the mechanism is ``feature_cache``).

- ``hotness``: the hotness stage's plan for partition r (most requested rows first, local and remote).
- ``hotness-remote``: the same budget filled with the most requested *remote* rows only. On a CPU rank the
  "device" cache sits in the same RAM as the own partition, so caching own rows saves nothing there, while every
  cached remote row saves an exchange (measured: the plain plan, mostly own rows under METIS, removed fewer remote
  lookups than a degree cache of the same size; see benchmarks/bench_train.py).
- ``degree``: the same number of rows, ranked by global in-degree (the usual baseline; equal budget).
- ``none``: nothing; every row comes from the store or its owner.
- ``auto`` (the default): ``hotness`` on a GPU, where a cached own row still saves a host→device copy, and
  ``hotness-remote`` on a CPU rank, where only remote rows are worth a cache slot.
"""

from __future__ import annotations

import numpy as np

from storage.errors import InputError
from storage.hotness import hot_store, read_plan
from storage.partition import BOOK, part_name
from storage.store import ArtifactStore
from storage.zarr_io import open_group, read_array
from stages.hotness.plan import degree_order

POLICIES = ("hotness", "hotness-remote", "degree", "none")


def resolve_policy(policy: str, device_type: str) -> str:
    """The concrete policy a rank on ``device_type`` ("cpu", "cuda") applies for ``policy`` (``auto`` or one of
    POLICIES)."""
    if policy == "auto":
        return "hotness" if device_type == "cuda" else "hotness-remote"
    return policy


def global_in_degree(store: ArtifactStore, partition_key: str, num_partitions: int) -> np.ndarray:
    """In-degree of every gid, from the partitions' ``indptr`` arrays only (8 bytes a node, no edges read)."""
    parts = [np.diff(read_array(open_group(store.url("partition", partition_key, part_name(p))), "indptr"))
             for p in range(num_partitions)]
    return np.concatenate(parts)


def cache_gids(policy: str, *, store: ArtifactStore, partition_key: str, hotness_key: str, rank: int,
               num_partitions: int) -> np.ndarray:
    """The gids rank ``rank`` caches under ``policy`` (int64; hot first for ``hotness``)."""
    if policy == "none":
        return np.empty(0, dtype=np.int64)
    if policy not in POLICIES:
        raise InputError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    plan = read_plan(store.url("hotness", hotness_key, hot_store(rank)))
    if plan.part != rank:
        raise InputError(f"cache plan hot-{rank} belongs to partition {plan.part}; rebuild the hotness stage")
    if policy == "hotness":
        return plan.plan_gid.astype(np.int64, copy=False)
    budget_rows = int(plan.plan_gid.shape[0])
    if policy == "hotness-remote":
        lo, hi = (int(b) for b in read_array(open_group(store.url("partition", partition_key, BOOK)),
                                             "bounds")[rank:rank + 2])
        ranked = plan.ranked_gid.astype(np.int64, copy=False)   # every requested gid, most requested first
        return ranked[(ranked < lo) | (ranked >= hi)][:budget_rows]
    return degree_order(global_in_degree(store, partition_key, num_partitions))[:budget_rows].astype(np.int64)
