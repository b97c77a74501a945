"""The hotness stage's parallel unit: plan a group of parts, wherever ``stages.executor`` runs it.

A unit is :func:`plan_parts` of a :class:`PlanJob`: small values only (the root's URL, the partition and features
manifests, the build's work directory, the stage's Params and the unit's share of the memory budget), so a Dask
worker on another host assembles the whole-graph CSR from the store itself (``stages.hotness.whole_csr``: in
memory when its share holds it, else mapped from its own scratch directory), pre-samples its parts, writes their
``hot-<p>.zarr`` and returns their summary rows and hit-rate curves and its own time and memory.

Why groups of parts and not one unit per part: every part samples the whole graph, so a unit assembles the CSR
(every edge read once) before planning any part. ``local`` runs one unit with every part (the CSR assembled once,
as before executors); on Dask there is one unit per worker slot (``executor.part_groups``). A part's samples come
from generators seeded by (seed, part) alone (``stages.runtime.seeds``), never from what ran before in the
process, so its plan is the same bytes whichever unit, process or host plans it (tests/test_executor_hotness.py).
A rerun of a unit (a worker killed mid-write) rewrites its stores whole (``storage.hotness.write_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.hotness import plan as planning
from stages.hotness.whole_csr import CsrLayout, assemble, choose_mapped
from stages.memory import MemoryBudget
from stages.meter import anon_rss_bytes, measure
from stages.runtime.sampling.fanouts import graph_fanouts
from stages.runtime.seeds import STREAM_HOTNESS_EVAL, STREAM_HOTNESS_FIT, stream_seed
from storage import ArtifactStore, Manifest
from storage.features import FeaturesArtifact
from storage.hotness import CachePlan, write_plan
from storage.partition import PartitionArtifact
from storage.writer import WorkDir

if TYPE_CHECKING:
    import torch

    from stages.hotness.stage import Params
    from stages.runtime.sampling.sampler import NeighborSampler
    from stages.train.tasks.base import SeedsOf


class RowCosts:
    """What a gid's feature row costs: one width for a homogeneous graph; per node type for a typed one, where
    ``row_bytes_of_gid`` is 0 for a featureless type's gids (not cacheable) and ``type_of_gid`` names each gid's."""

    def __init__(self, row_bytes: int, row_bytes_of_gid: np.ndarray | None = None,
                 type_of_gid: np.ndarray | None = None, type_names: tuple[str, ...] = ()) -> None:
        self.row_bytes, self.row_bytes_of_gid = row_bytes, row_bytes_of_gid
        self.type_of_gid, self.type_names = type_of_gid, type_names

    def cacheable(self, order_gid: np.ndarray) -> np.ndarray:
        return order_gid if self.row_bytes_of_gid is None else order_gid[self.row_bytes_of_gid[order_gid] > 0]

    def lookups(self, count_of_gid: np.ndarray) -> np.ndarray:
        """Feature-row lookups per gid: the requests of cacheable gids."""
        return count_of_gid if self.row_bytes_of_gid is None else np.where(self.row_bytes_of_gid > 0, count_of_gid, 0)

    def budget(self, params: Params, hot_order: np.ndarray, lo: int, hi: int) -> planning.Budget:
        num_nodes = hot_order.shape[0]
        if self.row_bytes_of_gid is None:
            return planning.budget_rows(budget_bytes=params.cache_budget_bytes, ratio=params.cache_ratio,
                                        row_bytes=self.row_bytes, part_rows=hi - lo, num_nodes=num_nodes)
        own_bytes = int(self.row_bytes_of_gid[lo:hi].sum())
        if params.cache_budget_bytes is not None:
            budget_bytes, base = params.cache_budget_bytes, f"{params.cache_budget_bytes:,} bytes per rank"
        else:
            budget_bytes = int(round(params.cache_ratio * own_bytes))
            base = f"{params.cache_ratio:g} × the partition's {own_bytes:,} feature bytes"
        rows = int(np.searchsorted(np.cumsum(self.row_bytes_of_gid[hot_order]), budget_bytes, side="right"))
        return planning.Budget(rows, f"{base} = {rows:,} rows of the featured types")

    def by_type(self, count_of_gid: np.ndarray) -> dict[str, int]:
        """Counts per gid summed per node type."""
        assert self.type_of_gid is not None
        sums = np.bincount(self.type_of_gid, weights=count_of_gid, minlength=len(self.type_names))
        return {name: int(v) for name, v in zip(self.type_names, sums)}

    def gids_by_type(self, gid: np.ndarray) -> dict[str, int]:
        """How many of ``gid`` are of each node type."""
        assert self.type_of_gid is not None
        counts = np.bincount(self.type_of_gid[gid], minlength=len(self.type_names))
        return {name: int(v) for name, v in zip(self.type_names, counts)}


def plan_partition(p: int, sampler: NeighborSampler, train_gid: torch.Tensor, in_degree_of_gid: np.ndarray,
                    deg_order: np.ndarray, lo: int, hi: int, costs: RowCosts, params: Params, progress: bool,
                    seeds_of: SeedsOf | None = None, limit: int | None = None
                    ) -> tuple[CachePlan, dict[str, Any], dict[str, Any]]:
    """``deg_order``: the degree baseline's ranking of the cacheable gids, the same for every partition;
    ``train_gid``: the training items (node gids; with ``seeds_of``, positions of positive edges)."""
    import torch

    from stages.hotness.counting import count_requests

    num_nodes = in_degree_of_gid.shape[0]
    # all epochs of partition p from one generator (epoch 0 of its stream); stream ids in stages.runtime.seeds
    fit_gen = torch.Generator().manual_seed(stream_seed(params.seed, p, 0, STREAM_HOTNESS_FIT))
    eval_gen = torch.Generator().manual_seed(stream_seed(params.seed, p, 0, STREAM_HOTNESS_EVAL))
    requests = count_requests(sampler, train_gid, batch_size=params.batch_size, epochs=params.epochs,
                              generator=fit_gen, desc=f"hotness: pre-sample part {p}", progress=progress,
                              seeds_of=seeds_of, limit=limit).numpy()
    fit = costs.lookups(requests)
    held_out = costs.lookups(count_requests(sampler, train_gid, batch_size=params.batch_size, epochs=1,
                                            generator=eval_gen, desc=f"hotness: evaluate part {p}",
                                            progress=progress, seeds_of=seeds_of, limit=limit).numpy())
    hot_order = costs.cacheable(planning.hotness_order(fit, in_degree_of_gid))
    budget = costs.budget(params, hot_order, lo, hi)
    plan_gid = hot_order[: budget.rows]
    requested = int(np.count_nonzero(fit))
    row_bytes = costs.row_bytes
    sizes = planning.curve_sizes(hi - lo, num_nodes)
    [hot_hit, deg_hit] = [planning.hit_rates(held_out, order, np.append(sizes, budget.rows))
                          for order in (hot_order, deg_order)]
    ceiling = planning.ceiling_hit_rates(held_out, np.append(sizes, budget.rows))   # held_out: cacheable rows only
    row = {"part": p, "train_seeds": int(train_gid.numel()), "requested_gids": requested,
           "lookups_per_epoch": int(held_out.sum()),
           "remote_lookup_share": float(1 - held_out[lo:hi].sum() / held_out.sum()) if held_out.sum() else 0.0,
           "plan_rows": int(budget.rows), "plan_bytes": int(budget.rows * row_bytes),
           "expected_hit_rate": float(hot_hit[-1]), "degree_hit_rate": float(deg_hit[-1]),
           "ceiling_hit_rate": float(ceiling[-1]),
           "remote_removed": planning.remote_share_removed(held_out, plan_gid, lo, hi),
           "budget": budget.note}
    if costs.type_of_gid is not None:   # typed: requests per node type (embedding rows too), and the plan's
        row["requests_by_type"] = costs.by_type(requests)
        row["plan_rows_by_type"] = costs.gids_by_type(plan_gid)
        row["plan_bytes"] = int(costs.row_bytes_of_gid[plan_gid].sum()) if costs.row_bytes_of_gid is not None else 0
    curve = {"part": p, "rows": sizes.tolist(), "fraction": list(planning.CURVE_FRACTIONS),
             "hotness": hot_hit[:-1].tolist(), "degree": deg_hit[:-1].tolist(), "ceiling": ceiling[:-1].tolist()}
    plan = CachePlan(p, plan_gid, hot_order[:requested], fit[hot_order[:requested]],
                     {**row, "row_bytes": row_bytes, "fanouts": list(params.fanouts)})
    return plan, row, curve


def train_items(params: Params, partition: PartitionArtifact, features: FeaturesArtifact, p: int
                 ) -> tuple[torch.Tensor, SeedsOf | None, int | None]:
    """Partition p's training items, how a batch of them becomes sample seeds (None: they are the seeds) and how
    many an epoch takes (None: all): the task's answer (``TaskDef.hotness_items``: its train nodes' gids, or for
    task=link the positions of its train positives and its share of ``edges_per_epoch``)."""
    from stages.train.tasks import task_def

    return task_def(params.task).hotness_items(params, partition, features, p)


def row_costs(partition: PartitionArtifact, features: FeaturesArtifact) -> RowCosts:
    schema = partition.schema
    if schema.is_homogeneous:
        return RowCosts(features.row_bytes)
    _, type_of_gid = partition.range_table().locate(np.arange(schema.num_nodes))
    featured = set(features.featured_types)
    type_bytes = np.array([features.row_bytes_of(t.name) if t.name in featured else 0 for t in schema.node_types],
                          dtype=np.int64)
    return RowCosts(0, type_bytes[type_of_gid], type_of_gid, tuple(t.name for t in schema.node_types))



@dataclass(frozen=True)
class PlanJob:
    """One unit: plan ``parts`` into ``out``; ``budget``: the unit's share of the stage's memory budget."""

    root: str
    partition: Manifest
    features: Manifest
    out: WorkDir
    parts: tuple[int, ...]
    params: Params
    budget: MemoryBudget
    progress: bool = False

    @property
    def label(self) -> str:
        """The unit's name in Prefect's task runs: its parts."""
        return f"parts-{self.parts[0]}-{self.parts[-1]}" if len(self.parts) > 1 else f"part-{self.parts[0]}"


def plan_parts(job: PlanJob) -> dict[str, Any]:
    """The unit: the whole CSR assembled, then each part of ``job.parts`` pre-sampled, planned and written.
    Returns each part's summary row (``rows``) and curve (``curves``), whether the CSR was mapped, and the unit's
    wall time and memory (``base_anon_bytes``: the interpreter's and torch's own, before the unit's arrays)."""
    # torch and torch_geometric load in seconds: only when a unit really runs, not for `status`
    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.sampler import NeighborSampler

    store = ArtifactStore(job.root)
    partition, features = PartitionArtifact(store, job.partition), FeaturesArtifact(store, job.features)
    params, schema = job.params, partition.schema
    fanouts = graph_fanouts(params.fanouts, params.edge_fanouts, schema)
    layout = CsrLayout.of(partition)
    rows: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    start_anon = anon_rss_bytes()
    with measure() as cost, job.out.scratch() as scratch:
        bounds = partition.bounds()
        base_anon = anon_rss_bytes() or 0
        mapped = choose_mapped(layout, job.budget, base_anon)
        csr = LocalCSR.from_numpy(*assemble(partition, layout, scratch if mapped else None), start_gid=0,
                                  num_edge_types=schema.num_edge_types)
        in_degree_of_gid = partition.in_degree()
        costs = row_costs(partition, features)
        deg_order = costs.cacheable(planning.degree_order(in_degree_of_gid))
        sampler = NeighborSampler(csr, fanouts)
        for p in job.parts:
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            items, seeds_of, limit = train_items(params, partition, features, p)
            plan, row, curve = plan_partition(p, sampler, items, in_degree_of_gid, deg_order, lo, hi, costs, params,
                                              job.progress, seeds_of, limit)
            write_plan(job.out, plan)
            rows.append(row)
            curves.append(curve)
    return {"rows": rows, "curves": curves, "mapped": mapped, "base_anon_bytes": base_anon,
            "start_anon_bytes": start_anon, **cost}
