"""Hotness stage: pre-sample E epochs from each partition's train seeds, count feature-row requests, plan caches.

On a typed graph the requests are counted per gid of every node type (sampled over every edge type, as training
samples) and the plan is one ranking across the featured types, filled to one byte budget: a type's row costs its
own width, and a featureless type's rows (learnt embeddings, owned by their ranks) are never planned. Ranking by
request count is what saves the most bytes per cached byte whatever a row's width, since a hit saves one row.

Contract: partition + features manifests + params → artifact ``hotness/<key>/`` with ``hot-<p>.zarr`` per
partition (format in ``storage.hotness``), ``curve.png`` and ``curves.json``. The plan is fitted on E epochs and
its hit rate measured on one more, independently drawn epoch, so the reported figures are not self-fulfilling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from stages.choices import TaskName
from stages.hotness import plan as planning
from stages.hotness.whole_csr import CsrLayout, assemble, choose_mapped
from stages.memory import MemoryBudget
from stages.meter import anon_rss_bytes, measure
from stages.params import FORM, BudgetedParams, EdgeFanouts, Fanouts, Seed
from stages.runtime.fanouts import graph_fanouts
from stages.runtime.seeds import STREAM_HOTNESS_EVAL, STREAM_HOTNESS_FIT, stream_seed
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.features import FeaturesArtifact
from storage.hotness import CURVE_PNG, CachePlan, write_curves, write_plan
from storage.partition import PartitionArtifact
from storage.report import Report, markdown_table
from storage.store import stage_key

if TYPE_CHECKING:
    import torch

    from stages.hotness.counting import SeedsOf
    from stages.runtime.sampler import NeighborSampler

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
    cache_budget_bytes: int | None = Field(None, ge=0, description="cache bytes per rank; takes precedence "
                                                                   "over cache_ratio")
    cache_ratio: float = Field(0.2, ge=0, description="cache rows per rank, as a fraction of its partition")
    seed: Seed = Field(0, description="pre-sampling seed")
    task: TaskName = Field("node", description="the training task: link pre-samples from positive edges and their "
                                               "negatives")
    num_negatives: int = Field(1, ge=1, description="task=link: negatives per positive; the training one")
    edges_per_epoch: int | None = Field(16_384, ge=1, description="task=link: positives an epoch trains on, over "
                                                                  "all partitions; the training one")

    def key_params(self) -> dict[str, Any]:
        """Every field; the link ones only for task=link (node keys as before)."""
        out = super().key_params()
        if self.task == "node":
            del out["task"], out["num_negatives"], out["edges_per_epoch"]
        return out



class _RowCosts:
    """What a gid's feature row costs: one width for a homogeneous graph; per node type for a typed one, where
    ``row_bytes_gid`` is 0 for a featureless type's gids (not cacheable) and ``type_of_gid`` names each gid's."""

    def __init__(self, row_bytes: int, row_bytes_gid: np.ndarray | None = None,
                 type_of_gid: np.ndarray | None = None, type_names: tuple[str, ...] = ()) -> None:
        self.row_bytes, self.row_bytes_gid = row_bytes, row_bytes_gid
        self.type_of_gid, self.type_names = type_of_gid, type_names

    def cacheable(self, order_gid: np.ndarray) -> np.ndarray:
        return order_gid if self.row_bytes_gid is None else order_gid[self.row_bytes_gid[order_gid] > 0]

    def lookups(self, count_gid: np.ndarray) -> np.ndarray:
        """Feature-row lookups per gid: the requests of cacheable gids."""
        return count_gid if self.row_bytes_gid is None else np.where(self.row_bytes_gid > 0, count_gid, 0)

    def budget(self, params: Params, hot_order: np.ndarray, lo: int, hi: int) -> planning.Budget:
        num_nodes = hot_order.shape[0]
        if self.row_bytes_gid is None:
            return planning.budget_rows(budget_bytes=params.cache_budget_bytes, ratio=params.cache_ratio,
                                        row_bytes=self.row_bytes, part_rows=hi - lo, num_nodes=num_nodes)
        own_bytes = int(self.row_bytes_gid[lo:hi].sum())
        if params.cache_budget_bytes is not None:
            budget_bytes, base = params.cache_budget_bytes, f"{params.cache_budget_bytes:,} bytes per rank"
        else:
            budget_bytes = int(round(params.cache_ratio * own_bytes))
            base = f"{params.cache_ratio:g} × the partition's {own_bytes:,} feature bytes"
        rows = int(np.searchsorted(np.cumsum(self.row_bytes_gid[hot_order]), budget_bytes, side="right"))
        return planning.Budget(rows, f"{base} = {rows:,} rows of the featured types")

    def by_type(self, count_gid: np.ndarray) -> dict[str, int]:
        """Counts per gid summed per node type."""
        assert self.type_of_gid is not None
        sums = np.bincount(self.type_of_gid, weights=count_gid, minlength=len(self.type_names))
        return {name: int(v) for name, v in zip(self.type_names, sums)}

    def gids_by_type(self, gid: np.ndarray) -> dict[str, int]:
        """How many of ``gid`` are of each node type."""
        assert self.type_of_gid is not None
        counts = np.bincount(self.type_of_gid[gid], minlength=len(self.type_names))
        return {name: int(v) for name, v in zip(self.type_names, counts)}


def _plan_partition(p: int, sampler: NeighborSampler, train_gid: torch.Tensor, in_degree_gid: np.ndarray,
                    deg_order: np.ndarray, lo: int, hi: int, costs: _RowCosts, params: Params, progress: bool,
                    seeds_of: SeedsOf | None = None, limit: int | None = None
                    ) -> tuple[CachePlan, dict[str, Any], dict[str, Any]]:
    """``deg_order``: the degree baseline's ranking of the cacheable gids, the same for every partition;
    ``train_gid``: the training items (node gids; with ``seeds_of``, positions of positive edges)."""
    import torch

    from stages.hotness.counting import count_requests

    num_nodes = in_degree_gid.shape[0]
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
    hot_order = costs.cacheable(planning.hotness_order(fit, in_degree_gid))
    budget = costs.budget(params, hot_order, lo, hi)
    plan_gid = hot_order[: budget.rows]
    requested = int(np.count_nonzero(fit))
    row_bytes = costs.row_bytes
    sizes = planning.curve_sizes(hi - lo, num_nodes)
    [hot_hit, deg_hit] = [planning.hit_rates(held_out, order, np.append(sizes, budget.rows))
                          for order in (hot_order, deg_order)]
    row = {"part": p, "train_seeds": int(train_gid.numel()), "requested_gids": requested,
           "lookups_per_epoch": int(held_out.sum()),
           "remote_lookup_share": float(1 - held_out[lo:hi].sum() / held_out.sum()) if held_out.sum() else 0.0,
           "plan_rows": int(budget.rows), "plan_bytes": int(budget.rows * row_bytes),
           "expected_hit_rate": float(hot_hit[-1]), "degree_hit_rate": float(deg_hit[-1]),
           "remote_removed": planning.remote_share_removed(held_out, plan_gid, lo, hi),
           "budget": budget.note}
    if costs.type_of_gid is not None:   # typed: requests per node type (embedding rows too), and the plan's
        row["requests_by_type"] = costs.by_type(requests)
        row["plan_rows_by_type"] = costs.gids_by_type(plan_gid)
        row["plan_bytes"] = int(costs.row_bytes_gid[plan_gid].sum()) if costs.row_bytes_gid is not None else 0
    curve = {"part": p, "rows": sizes.tolist(), "fraction": list(planning.CURVE_FRACTIONS),
             "hotness": hot_hit[:-1].tolist(), "degree": deg_hit[:-1].tolist()}
    plan = CachePlan(p, plan_gid, hot_order[:requested], fit[hot_order[:requested]],
                     {**row, "row_bytes": row_bytes, "fanouts": list(params.fanouts)})
    return plan, row, curve


def _train_items(params: Params, partition: PartitionArtifact, features: FeaturesArtifact, p: int
                 ) -> tuple[torch.Tensor, SeedsOf | None, int | None]:
    """Partition p's training items, how a batch of them becomes sample seeds (None: they are the seeds) and how
    many an epoch takes (None: all): its train nodes' gids, or for task=link the positions of its train positives
    (``link_seeds_of``), its share of ``edges_per_epoch`` (as the train stage's ``rank_share``)."""
    import torch

    from stages.hotness.counting import link_seeds_of
    from stages.runtime.dist_sampler import proportional_share
    from stages.runtime.negatives import NegativeDraws
    from stages.runtime.typed_rows import TypeIndex

    if params.task == "node":
        train_gid = features.part(p, load_x=False).split_lids["train"] + int(partition.bounds()[p])
        return torch.from_numpy(train_gid), None, None
    key = partition.link_edge_type
    if key is None:
        raise InputError("hotness task=link needs a graph split for it: run the download stage with task=link too "
                         "(set task=link for the whole pipeline)")
    draws = NegativeDraws.for_link(partition.schema, key, TypeIndex(partition.range_table()))
    edge_gid = torch.from_numpy(partition.edge_split(p, "train"))
    limit = None
    if params.edges_per_epoch is not None:
        total = sum(sizes["train"] for sizes in partition.manifest.summary["edge_split_sizes"])
        limit = proportional_share(params.edges_per_epoch, int(edge_gid.shape[1]), total)
    return torch.arange(edge_gid.shape[1]), link_seeds_of(edge_gid, draws, params.num_negatives), limit


def _row_costs(partition: PartitionArtifact, features: FeaturesArtifact) -> _RowCosts:
    schema = partition.schema
    if schema.is_homogeneous:
        return _RowCosts(features.row_bytes)
    _, type_of_gid = partition.range_table().locate(np.arange(schema.num_nodes))
    featured = set(features.featured_types)
    type_bytes = np.array([features.row_bytes_of(t.name) if t.name in featured else 0 for t in schema.node_types],
                          dtype=np.int64)
    return _RowCosts(0, type_bytes[type_of_gid], type_of_gid, tuple(t.name for t in schema.node_types))


def _csr_note(layout: CsrLayout, mapped: bool) -> str:
    where = "memory-mapped from spill files" if mapped else "in memory"
    return (f"{layout.num_edges:,} {layout.index_dtype.name} CSR indices {where} (in-memory path: "
            f"{layout.in_memory():,} bytes)")


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    partition = PartitionArtifact(store, upstream["partition"])
    features = FeaturesArtifact(store, upstream["features"])
    schema = partition.schema
    fanouts = graph_fanouts(params.fanouts, params.edge_fanouts, schema)   # before anything is written
    budget = MemoryBudget.resolve(params.memory_budget_bytes, NAME)
    layout = CsrLayout.of(partition)
    key = stage_key(NAME, VERSION, params.key_params(), {name: m.key for name, m in upstream.items()})
    if force or store.find(NAME, key) is None:   # a cached plan is read whatever the budget
        budget.require(layout.minimum(), layout.describe_minimum())

    def body(writer: StageWriter) -> None:
        # torch, torch_geometric and matplotlib load in seconds: only when the stage really runs, not for `status`

        from stages.hotness.plot import hit_rate_png
        from stages.runtime.sampler import LocalCSR, NeighborSampler

        rows: list[dict[str, Any]] = []
        curves: list[dict[str, Any]] = []
        with measure() as cost, writer.scratch() as scratch:
            num_parts, bounds = partition.num_partitions, partition.bounds()
            base_anon = anon_rss_bytes() or 0   # the interpreter's and torch's own, before the stage's arrays
            mapped = choose_mapped(layout, budget, base_anon)
            csr = LocalCSR.from_numpy(*assemble(partition, layout, scratch if mapped else None), start_gid=0,
                                      num_edge_types=schema.num_edge_types)
            in_degree_gid = partition.in_degree()
            costs = _row_costs(partition, features)
            deg_order = costs.cacheable(planning.degree_order(in_degree_gid))
            sampler = NeighborSampler(csr, fanouts)
            for p in range(num_parts):
                lo, hi = int(bounds[p]), int(bounds[p + 1])
                train_items, seeds_of, limit = _train_items(params, partition, features, p)
                plan, row, curve = _plan_partition(p, sampler, train_items, in_degree_gid, deg_order, lo, hi,
                                                   costs, params, progress, seeds_of, limit)
                write_plan(writer, plan)
                rows.append(row)
                curves.append(curve)
            write_curves(writer, curves, hit_rate_png(curves))
        writer.summary.update({"num_partitions": num_parts, "parts": rows, "curves": curves,
                               "fanouts": list(params.fanouts), "edge_fanouts": dict(params.edge_fanouts),
                               "epochs": params.epochs,
                               "budget": rows[0]["budget"] if rows else "",
                               "memory_budget": budget.describe(), "csr": _csr_note(layout, mapped),
                               "base_anon_bytes": base_anon, **cost})

    return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


def report(manifest: Manifest) -> Report:
    s = manifest.summary
    table = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "budget"}
             for r in s["parts"]]
    mean_hit = float(np.mean([r["expected_hit_rate"] for r in s["parts"]])) if s["parts"] else 0.0
    mean_deg = float(np.mean([r["degree_hit_rate"] for r in s["parts"]])) if s["parts"] else 0.0
    mean_rem = float(np.mean([r["remote_removed"] for r in s["parts"]])) if s["parts"] else 0.0
    headline = (f"cache plan {s['budget']}: expected hit rate {100 * mean_hit:.1f} % (degree cache "
                f"{100 * mean_deg:.1f} %), removes {100 * mean_rem:.1f} % of remote lookups")
    curve_rows = []
    for c in s["curves"]:
        for f, h, d in zip(c["fraction"], c["hotness"], c["degree"]):
            curve_rows.append({"part": c["part"], "cache_%_of_part": round(100 * f, 1),
                               "hotness_hit_%": round(100 * h, 2), "degree_hit_%": round(100 * d, 2)})
    per_type = f" (per edge type {s['edge_fanouts']})" if s.get("edge_fanouts") else ""
    # builds from before the memory budget say nothing of where their CSR lived
    csr = f" Sampled from {s['csr']}; memory budget {s['memory_budget']}." if s.get("csr") else ""
    md = (f"## hotness `{manifest.key}`\n\n{headline}\n\nfanouts {s['fanouts']}{per_type}, {s['epochs']} pre-sampled "
          f"epoch(s); hit rates measured on an independent epoch.{csr}\n\n{markdown_table(table)}\n\n"
          f"### Hit-rate curve\n\n{markdown_table(curve_rows)}\n")
    return Report(headline, table, md, images={"hit-rate curve": CURVE_PNG})
