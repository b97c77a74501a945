"""The hotness artifact format: per partition, ``hot-<p>.zarr``.

ID space: gids (any partition's: the plan holds local and remote rows).

- ``gid`` int64 [k], ``count`` int64 [k]: every gid the pre-sampled epochs requested from partition p's
  seeds, most requested first (ties: higher in-degree first). ``count`` is the number of batches whose
  ``n_id`` held the gid, i.e. feature-row lookups.
- ``plan_gid`` int64 [m]: the cache plan, the first ``m`` gids of the ranking that fit the byte budget
  (when fewer than ``m`` gids were ever requested, the rest is filled by in-degree).
- attrs: part, plan_rows, plan_bytes, row_bytes, budget note, expected hit rate, remote share removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.errors import ArtifactError
from storage.zarr_io import open_group, read_array, write_array


def hot_store(p: int) -> str:
    return f"hot-{p}.zarr"


@dataclass
class CachePlan:
    part: int
    plan_gid: np.ndarray   # gids to cache, in priority order
    ranked_gid: np.ndarray
    ranked_count: np.ndarray
    attrs: dict[str, Any]


def write_plan(url: str, plan: CachePlan) -> None:
    g = open_group(url, mode="w")
    write_array(g, "gid", plan.ranked_gid.astype(np.int64, copy=False), chunk_rows=1 << 20)
    write_array(g, "count", plan.ranked_count.astype(np.int64, copy=False), chunk_rows=1 << 20)
    write_array(g, "plan_gid", plan.plan_gid.astype(np.int64, copy=False), chunk_rows=1 << 20)
    g.attrs.update({"part": plan.part, **plan.attrs})


def read_plan(url: str) -> CachePlan:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe cache plan (no attrs); rerun the hotness stage")
    return CachePlan(int(attrs["part"]), read_array(g, "plan_gid"), read_array(g, "gid"), read_array(g, "count"),
                     attrs)
