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

from stages.choices import CACHE_POLICIES
from stages.hotness.plan import degree_order
from storage.errors import ArtifactError
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact


def resolve_policy(policy: str, device_type: str) -> str:
    """The concrete policy a rank on ``device_type`` ("cpu", "cuda") applies for ``policy`` (``auto`` or one of
    CACHE_POLICIES)."""
    if policy == "auto":
        return "hotness" if device_type == "cuda" else "hotness-remote"
    return policy


def cache_gids(policy: str, *, partition: PartitionArtifact, hotness: HotnessArtifact, rank: int) -> np.ndarray:
    """The gids rank ``rank`` caches under ``policy`` (int64; hot first for ``hotness``)."""
    if policy == "none":
        return np.empty(0, dtype=np.int64)
    if policy not in CACHE_POLICIES:   # the Params' Literal took user input; this is a caller's bug
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(CACHE_POLICIES)}")
    plan = hotness.plan(rank)
    if plan.part != rank:
        raise ArtifactError(f"the cache plan stored for partition {rank} belongs to partition {plan.part}; rebuild "
                            f"the hotness stage with --force hotness")
    if policy == "hotness":
        return plan.plan_gid.astype(np.int64, copy=False)
    budget_rows = int(plan.plan_gid.shape[0])
    if policy == "hotness-remote":
        lo, hi = (int(b) for b in partition.bounds()[rank:rank + 2])
        ranked = plan.ranked_gid.astype(np.int64, copy=False)   # every requested gid, most requested first
        return ranked[(ranked < lo) | (ranked >= hi)][:budget_rows]
    return degree_order(partition.in_degree())[:budget_rows].astype(np.int64)
