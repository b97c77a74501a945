"""Cache plans from request counts, and the hit-rate curves that compare them with a degree-ranked cache and with
the ceiling (the held-out epoch's own most requested rows).

Policy only: which gids a rank should cache. How cached rows are fetched lives in the training runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CURVE_FRACTIONS = (0.01, 0.02, 0.05, 0.10, 0.20, 0.30, 0.50, 1.00)


@dataclass
class Budget:
    rows: int
    note: str


def budget_rows(*, budget_bytes: int | None, ratio: float | None, row_bytes: int, part_rows: int,
                num_nodes: int) -> Budget:
    """Rows a rank may cache: a byte budget, or a ratio of the partition's own rows; clamped to the graph."""
    if budget_bytes is not None:
        rows, base = budget_bytes // max(row_bytes, 1), f"{budget_bytes:,} bytes per rank ({row_bytes} B/row)"
    else:
        rows, base = int(round((ratio or 0.0) * part_rows)), f"{ratio:g} × the partition's {part_rows:,} own rows"
    if rows > num_nodes:
        return Budget(num_nodes, f"{base} = {rows:,} rows, clamped to the graph's {num_nodes:,} nodes")
    return Budget(int(rows), f"{base} = {rows:,} rows")


def hotness_order(count_of_gid: np.ndarray, in_degree_of_gid: np.ndarray) -> np.ndarray:
    """All gids, most requested first; ties (notably never-requested gids) by in-degree, then gid."""
    return np.lexsort((np.arange(count_of_gid.shape[0]), -in_degree_of_gid, -count_of_gid))


def degree_order(in_degree_of_gid: np.ndarray) -> np.ndarray:
    """The baseline: all gids by in-degree, highest first (what a degree-based cache would hold)."""
    return np.lexsort((np.arange(in_degree_of_gid.shape[0]), -in_degree_of_gid))


def hit_rates(eval_count_of_gid: np.ndarray, order_gid: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Share of the lookups in ``eval_count_of_gid`` served by a cache of the first ``s`` gids of ``order_gid``."""
    total = eval_count_of_gid.sum()
    if total == 0:
        return np.zeros(len(sizes))
    cum = np.concatenate([[0], np.cumsum(eval_count_of_gid[order_gid])])
    return cum[np.minimum(sizes, order_gid.shape[0])] / total


def ceiling_hit_rates(eval_count_of_gid: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The best any cache of ``s`` rows can do on the epoch ``eval_count_of_gid`` counts: its own ``s`` most
    requested rows (the ceiling a plan fitted on other epochs is measured against). Sorts only the requested gids'
    counts, so it holds no ranking of every gid (the stage's memory figure, ``whole_csr``)."""
    total = eval_count_of_gid.sum()
    if total == 0:
        return np.zeros(len(sizes))
    top = np.sort(eval_count_of_gid[eval_count_of_gid > 0])[::-1]
    cum = np.concatenate([[0], np.cumsum(top)])
    return cum[np.minimum(sizes, top.shape[0])] / total


def remote_share_removed(eval_count_of_gid: np.ndarray, plan_gid: np.ndarray, lo: int, hi: int) -> float:
    """Share of the lookups of remote rows (gids outside ``[lo, hi)``) that the plan serves from cache."""
    remote = eval_count_of_gid.copy()
    remote[lo:hi] = 0
    total = remote.sum()
    return float(remote[plan_gid].sum() / total) if total else 0.0


def curve_sizes(part_rows: int, num_nodes: int) -> np.ndarray:
    return np.minimum(np.round(np.array(CURVE_FRACTIONS) * part_rows).astype(np.int64), num_nodes)
