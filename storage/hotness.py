"""The hotness artifact format: per partition, ``hot-<p>.zarr``.

ID space: gids (any partition's: the plan holds local and remote rows).

- ``gid`` int64 [k], ``count`` int64 [k]: every gid the pre-sampled epochs requested from partition p's
  seeds, most requested first (ties: higher in-degree first). ``count`` is the number of batches whose
  ``n_id`` held the gid, i.e. feature-row lookups.
- ``plan_gid`` int64 [m]: the cache plan, the first ``m`` gids of the ranking that fit the byte budget
  (when fewer than ``m`` gids were ever requested, the rest is filled by in-degree).
- attrs: part, plan_rows, plan_bytes, row_bytes, budget note, expected hit rate, remote share removed.

Beside them: ``curves.json`` (per partition, the hit rate of a hotness cache, of a degree cache and the ceiling
(the held-out epoch's own top rows) at each cache size, measured on a held-out epoch; builds before the ceiling lack
it) and ``curve.png``, its plot.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from storage.errors import ArtifactError
from storage.store import ArtifactHandle
from storage.summaries import HotnessSummary
from storage.writer import StageWriter, WorkDir
from storage.zarr_io import attr_int, open_group, read_array, write_array

CURVE_PNG = "curve.png"
_CURVES_JSON = "curves.json"


def _hot_store(p: int) -> str:
    return f"hot-{p}.zarr"


@dataclass
class CachePlan:
    part: int
    plan_gid: np.ndarray   # gids to cache, in priority order
    ranked_gid: np.ndarray
    ranked_count: np.ndarray
    attrs: dict[str, Any]


def write_plan(out: WorkDir, plan: CachePlan) -> None:
    """Write partition ``plan.part``'s ranking and plan as ``hot-<p>.zarr`` of the build's work directory ``out``
    (``StageWriter.work_dir``: wherever a unit runs). Mode ``w`` replaces whatever a killed earlier try of the unit
    left of the store, so a rerun writes the same bytes."""
    g = open_group(out.file_url(_hot_store(plan.part)), mode="w")
    write_array(g, "gid", plan.ranked_gid.astype(np.int64, copy=False), chunk_rows=1 << 20)
    write_array(g, "count", plan.ranked_count.astype(np.int64, copy=False), chunk_rows=1 << 20)
    write_array(g, "plan_gid", plan.plan_gid.astype(np.int64, copy=False), chunk_rows=1 << 20)
    g.attrs.update({"part": plan.part, **plan.attrs})


def write_curves(writer: StageWriter, curves: list[dict[str, Any]], png: bytes) -> None:
    """Write ``curves.json`` and its plot ``curve.png``."""
    writer.write_json(_CURVES_JSON, curves)
    writer.write_bytes(CURVE_PNG, png)


def _read_plan(url: str) -> CachePlan:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe cache plan (no attrs); rerun the hotness stage")
    return CachePlan(attr_int(attrs, "part", url), read_array(g, "plan_gid"), read_array(g, "gid"),
                     read_array(g, "count"), attrs)


class HotnessArtifact(ArtifactHandle):
    """The hotness stage's artifact, read through its manifest."""

    STAGE = "hotness"

    @cached_property
    def summary(self) -> HotnessSummary:
        return HotnessSummary.from_json(self.manifest.summary)

    @property
    def num_partitions(self) -> int:
        return int(self.summary.num_partitions)

    def plan(self, p: int) -> CachePlan:
        """Partition p's cache plan (gids, most requested first)."""
        return _read_plan(self._url(_hot_store(p)))
