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

How many: the plan's own size, or (``fit``: a runtime budget, ``cache_budget``) as many of the policy's ranking as
fit. Past the rows that pre-sampling requested, the hotness ranking goes on by in-degree, so a budget of the whole
graph caches every row.
"""

from __future__ import annotations

from collections.abc import Callable

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


Fit = Callable[[np.ndarray], int]   # ranked gids -> how many of the first ones fit the budget


def full_ranking(ranked_gid: np.ndarray, in_degree_of_gid: np.ndarray) -> np.ndarray:
    """``ranked_gid`` (the gids pre-sampling requested, most requested first), then every other gid by in-degree."""
    rest = degree_order(in_degree_of_gid)
    seen = np.zeros(in_degree_of_gid.shape[0], dtype=bool)
    seen[ranked_gid] = True
    return np.concatenate([ranked_gid, rest[~seen[rest]]]).astype(np.int64, copy=False)


def cache_gids(policy: str, *, partition: PartitionArtifact, hotness: HotnessArtifact, rank: int,
               fit: Fit | None = None, fills: bool = True) -> np.ndarray:
    """The gids rank ``rank`` caches under ``policy`` (int64; hot first for ``hotness``): the plan's count, or with
    ``fit`` as many of the policy's ranking as it says fit; with ``fills=False`` the plan's count, at most what
    ``fit`` says fit (a cap, ``CacheBudget.fills``)."""
    if fit is not None and not fills:
        planned = cache_gids(policy, partition=partition, hotness=hotness, rank=rank)
        return planned[:fit(planned)]
    if policy == "none":
        return np.empty(0, dtype=np.int64)
    if policy not in CACHE_POLICIES:   # the Params' Literal took user input; this is a caller's bug
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(CACHE_POLICIES)}")
    plan = hotness.plan(rank)
    if plan.part != rank:
        raise ArtifactError(f"the cache plan stored for partition {rank} belongs to partition {plan.part}; rebuild "
                            f"the hotness stage with --force hotness")
    ranked = plan.ranked_gid.astype(np.int64, copy=False)   # every requested gid, most requested first
    if fit is None:
        if policy == "hotness":
            return plan.plan_gid.astype(np.int64, copy=False)
        fit = rows_within(int(plan.plan_gid.shape[0]))
    if policy == "hotness":
        fitting = fit(ranked)   # a byte fit is a cumulative sum over the whole ranking: once
        if fitting < ranked.shape[0]:
            return ranked[:fitting]
        ranking = full_ranking(ranked, partition.in_degree())
        return ranking[:fit(ranking)]
    if policy == "hotness-remote":
        lo, hi = (int(b) for b in partition.bounds()[rank:rank + 2])
        remote = ranked[(ranked < lo) | (ranked >= hi)]
        return remote[:fit(remote)]
    by_degree = degree_order(partition.in_degree()).astype(np.int64)
    return by_degree[:fit(by_degree)]


def rows_within(rows: int) -> Fit:
    """The budget of rows of one width: the first ``rows`` of any ranking."""
    return lambda ranking: min(rows, int(ranking.shape[0]))


def bytes_within(budget_bytes: int, row_bytes_of: Callable[[np.ndarray], np.ndarray]) -> Fit:
    """A byte budget over rows of several widths (a typed graph's node types; 0 for a type without stored rows):
    the longest prefix of the ranking whose rows add up to at most ``budget_bytes``."""
    def fit(ranking: np.ndarray) -> int:
        used = np.cumsum(row_bytes_of(ranking), dtype=np.int64)
        return int(np.searchsorted(used, budget_bytes, side="right"))
    return fit
