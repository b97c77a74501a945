"""Hotness stage: pre-sample E epochs from each partition's train seeds, count feature-row requests, plan caches.

On a typed graph the requests are counted per gid of every node type (sampled over every edge type, as training
samples) and the plan is one ranking across the featured types, filled to one byte budget: a type's row costs its
own width, and a featureless type's rows (learnt embeddings, owned by their ranks) are never planned. Ranking by
request count is what saves the most bytes per cached byte whatever a row's width, since a hit saves one row.

Contract: partition + features manifests + params → artifact ``hotness/<key>/`` with ``hot-<p>.zarr`` per
partition (format in ``storage.hotness``), ``curve.png`` and ``curves.json``. The plan is fitted on E epochs and
its hit rate measured on one more, independently drawn epoch, so the reported figures are not self-fulfilling.
The parts are planned by units (``stages.hotness.units``: a group of parts each, over the CSR it assembles) on the
``executor`` (``stages.executor``: this process, or a Dask cluster), byte-identical whichever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from stages.choices import TaskName
from stages.executor import open_executor, part_groups, unit_record
from stages.hotness.units import PlanJob, plan_parts
from stages.hotness.whole_csr import CsrLayout
from stages.memory import MemoryBudget
from stages.meter import measure
from stages.params import FORM, BudgetedParams, EdgeFanouts, Fanouts, Seed, check_graph_fanouts
from stages.train.tasks import TASKS
from stages.train.tasks.base import key_without
from storage import ArtifactStore, Manifest, StageWriter
from storage.hotness import CURVE_PNG, write_curves
from storage.partition import PartitionArtifact
from storage.report import Report, markdown_table
from storage.summaries import HotnessSummary

NAME = "hotness"
VERSION = 4   # 4: typed graphs; 3: the neighbour draws come from the stage's seed (torch's global generator before)
UPSTREAM = ("partition", "features")


class Params(BudgetedParams):
    fanouts: Fanouts = Field((15, 10, 5), description="neighbours per hop (-1 = all); the training ones")
    edge_fanouts: EdgeFanouts = Field(default_factory=dict, description="per-hop fanouts of some edge types; the "
                                                                         "training ones",
                                      json_schema_extra={FORM: 'a JSON object {"edge type": [fanout per hop]}'})
    batch_size: int = Field(1024, ge=1, description="seeds per batch; the training one")
    epochs: int = Field(1, ge=1, description="epochs pre-sampled to count feature-row requests")
    # the plan's size: what the report evaluates and a CPU rank caches; a GPU rank sizes its cache where it runs
    # (train's device_cache_*, stages.train.rank.cache_budget), taking the ranking's first rows
    cache_budget_bytes: int | None = Field(None, ge=0, description="the cache plan's bytes per rank (CPU ranks "
                                                                   "cache the plan; GPU ranks fill their free "
                                                                   "memory, train.device_cache_bytes caps them); "
                                                                   "takes precedence over cache_ratio")
    cache_ratio: float = Field(0.2, ge=0, description="the cache plan's rows per rank, as a fraction of its "
                                                      "partition (CPU ranks cache the plan; GPU ranks fill their "
                                                      "free memory, train.device_cache_ratio caps them)")
    seed: Seed = Field(0, description="pre-sampling seed")
    task: TaskName = Field("node", description="the training task: link pre-samples from positive edges and their "
                                               "negatives")
    num_negatives: int = Field(1, ge=1, description="task=link: negatives per positive; the training one")
    edges_per_epoch: int | None = Field(16_384, ge=1, description="task=link: positives an epoch trains on, over "
                                                                  "all partitions; the training one")

    def key_params(self) -> dict[str, Any]:
        """Every field; the link ones only for task=link (node keys as before)."""
        out = super().key_params()
        key_without(out, self.task, list(TASKS.values()), hotness=True)
        return out


def _csr_note(layout: CsrLayout, mapped: list[bool]) -> str:
    """Where the units' CSRs lived (``mapped``: each unit's), for the report."""
    where = "memory-mapped from spill files" if all(mapped) else "in memory"
    if 0 < sum(mapped) < len(mapped):   # shares on different hosts may choose differently
        where = f"memory-mapped from spill files in {sum(mapped)} of {len(mapped)} units, in memory in the others"
    return (f"{layout.num_edges:,} {layout.index_dtype.name} CSR indices {where} (in-memory path: "
            f"{layout.in_memory():,} bytes)")


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    partition = PartitionArtifact(store, upstream["partition"])
    check_graph_fanouts(params.fanouts, params.edge_fanouts, partition.schema)   # checked before anything is written
    budget = MemoryBudget.resolve(params.memory_budget_bytes, NAME)
    layout = CsrLayout.of(partition)
    # a cached build is returned whatever the budget and executor (runtime settings, not in the key)
    if not force and (cached := store.cached(NAME, VERSION, params.key_params(), upstream)) is not None:
        return cached
    num_parts = partition.num_partitions
    with open_executor(params.executor, units=num_parts, store=store) as executor:
        # each unit holds the O(N) minimum itself (it assembles its own CSR)
        share = budget.share(executor.slots, layout.minimum(), layout.describe_minimum())

        def body(writer: StageWriter) -> None:
            # matplotlib loads in a second: only when the stage really runs, not for `status`
            from stages.hotness.plot import hit_rate_png

            with measure() as cost:
                jobs = [PlanJob(store.root, upstream["partition"], upstream["features"], writer.work_dir(), group,
                                params, share, progress=progress and executor.slots == 1)
                        for group in part_groups(num_parts, executor.slots)]
                units = executor.map(plan_parts, jobs, name="hotness-unit")
                rows = sorted((r for u in units for r in u["rows"]), key=lambda r: r["part"])
                curves = sorted((c for u in units for c in u["curves"]), key=lambda c: c["part"])
                write_curves(writer, curves, hit_rate_png(curves))
            writer.summary.update({"num_partitions": num_parts, "parts": rows, "curves": curves,
                                   "fanouts": list(params.fanouts), "edge_fanouts": dict(params.edge_fanouts),
                                   "epochs": params.epochs,
                                   "budget": rows[0]["budget"] if rows else "",
                                   "memory_budget": share.describe(),
                                   "csr": _csr_note(layout, [u["mapped"] for u in units]),
                                   "base_anon_bytes": max(u["base_anon_bytes"] for u in units),
                                   **_with_units(cost, units, executor.slots)})

        return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


def _with_units(cost: dict[str, Any], units: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """The stage's own figures; on Dask also each unit's: its parts, where its CSR lived, its time and memory (a
    worker's peak is not this process's)."""
    if slots == 1:   # the one unit ran in this process: its peak is within the stage's
        return cost
    return {**cost, "executor_slots": slots,
            "units": [unit_record([r["part"] for r in u["rows"]], u, csr_mapped=u["mapped"]) for u in units]}


def report(manifest: Manifest) -> Report:
    s = HotnessSummary.from_json(manifest.summary)
    table = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "budget"}
             for r in s.parts]
    mean_hit = float(np.mean([r["expected_hit_rate"] for r in s.parts])) if s.parts else 0.0
    mean_deg = float(np.mean([r["degree_hit_rate"] for r in s.parts])) if s.parts else 0.0
    mean_rem = float(np.mean([r["remote_removed"] for r in s.parts])) if s.parts else 0.0
    ceilings = [r["ceiling_hit_rate"] for r in s.parts if "ceiling_hit_rate" in r]   # builds before it: none
    ceiling = f", ceiling {100 * float(np.mean(ceilings)):.1f} %" if ceilings and len(ceilings) == len(s.parts) else ""
    explained = (" (the ceiling: that epoch's own most requested rows, the best any cache of the size can do)"
                 if ceiling else "")
    headline = (f"cache plan {s.budget}: expected hit rate {100 * mean_hit:.1f} % (degree cache "
                f"{100 * mean_deg:.1f} %{ceiling}), removes {100 * mean_rem:.1f} % of remote lookups")
    curve_rows = []
    for c in s.curves:
        for i, (f, h, d) in enumerate(zip(c["fraction"], c["hotness"], c["degree"])):
            curve_rows.append({"part": c["part"], "cache_%_of_part": round(100 * f, 1),
                               "hotness_hit_%": round(100 * h, 2), "degree_hit_%": round(100 * d, 2),
                               **({"ceiling_hit_%": round(100 * c["ceiling"][i], 2)} if "ceiling" in c else {})})
    per_type = f" (per edge type {s.edge_fanouts})" if s.edge_fanouts else ""
    # builds from before the memory budget say nothing of where their CSR lived
    csr = f" Sampled from {s.csr}; memory budget {s.memory_budget}." if s.csr else ""
    md = (f"## hotness `{manifest.key}`\n\n{headline}\n\nfanouts {s.fanouts}{per_type}, {s.epochs} pre-sampled "
          f"epoch(s); hit rates measured on an independent epoch{explained}.{csr}\n\n{markdown_table(table)}\n\n"
          f"### Hit-rate curve\n\n{markdown_table(curve_rows)}\n")
    return Report(headline, table, md, images={"hit-rate curve": CURVE_PNG})
