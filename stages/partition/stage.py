"""Partition stage: graph.zarr → METIS (KaMinPar, random) parts, relabelled to contiguous gid ranges.

Contract: download manifest + params → artifact ``partition/<key>/`` with ``book.zarr`` (bounds, orig_of_gid,
gid_of_orig) and ``part-<p>.zarr`` (incoming-edge CSR over lids, neighbour gids); format in ``storage.partition``.
The partitioner runs in this process; the parts are written here (``executor=local``) or, after the book, by units
on a Dask cluster (``stages.partition.units``), byte-identical whichever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import Field

from stages.choices import PartitionMethod
from stages.executor import LOCAL, Executor, open_executor, part_groups
from stages.memory import MemoryBudget
from stages.meter import measure
from stages.params import BudgetedParams, Seed, runtime
from stages.partition.footprint import UNIT_HOLDS, MemoryPlan, plan, unit_minimum
from stages.partition.kaminpar_runner import kaminpar_threads
from stages.partition.streamed import link_stats, mapped_graph, with_part_lists, write_parts_streamed
from stages.partition.units import PartsJob, part_lists, unit_figures, write_parts
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.graph import Graph, GraphArtifact
from storage.partition import PartitionBook, write_book, write_part
from storage.progress import progress as tqdm
from storage.report import Report, markdown_table
from storage.summaries import DownloadSummary, PartitionSummary

NAME = "partition"
VERSION = 1
UPSTREAM = ("download",)


class Params(BudgetedParams):
    num_partitions: int = Field(2, ge=1, description="parts, one training rank each")
    # kaminpar at 1 M nodes: METIS's cut (5.6 vs 5.5 %) with 0.30 GiB over the start against 1.97
    # (benchmarks/RESULTS.md "[2/5] KaMinPar beside METIS")
    method: PartitionMethod = Field("metis", description="metis (min edge cut; a sampled input past 16 M "
                                                         "entries), kaminpar (the same cut in a sixth of the "
                                                         "memory: big graphs), random (balanced, no locality)")
    seed: Seed = Field(0, description="METIS / KaMinPar / random assignment seed")
    balance_train: bool = Field(True, description="equal train nodes per part: uneven counts mean padded "
                                                  "(wasted) DDP steps")
    balance_edges: bool = Field(True, description="equal in-edges per part: equal sampling work per rank")
    # 1 by default: only one thread gives the same partition again (stages/partition/kaminpar_runner.py measured
    # three runs, three partitions with 2 threads), and a rebuilt partition must match what was built on it
    kaminpar_threads: int | None = runtime(1, ge=1, description="threads of method=kaminpar; null: every usable "
                                                                "CPU (faster, but not reproducible)")


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    download = upstream["download"]
    artifact = GraphArtifact(store, download)
    num_nodes = artifact.num_nodes
    if params.num_partitions > num_nodes:
        raise InputError(f"num_partitions={params.num_partitions} exceeds the graph's {num_nodes} nodes; "
                         f"choose 1..{num_nodes}")
    # the memory plan fails (one line) before store.build makes any directory; a cached build needs none
    cached = not force and store.cached(NAME, VERSION, params.key_params(), upstream) is not None
    memory = None if cached else memory_plan(artifact, params)
    if memory is None or params.executor == LOCAL:   # cached, or the parts written here as before executors
        return store.build(NAME, VERSION, params.key_params(), upstream,
                           _body(artifact, params, memory, progress, None), force=force)
    with open_executor(params.executor, units=params.num_partitions, store=store) as executor:
        # the partitioner runs alone in this process, under the whole budget; then the units run, each within its
        # share, while this process holds the summary only (stages.partition.units, footprint.unit_minimum)
        MemoryBudget.resolve(params.memory_budget_bytes, NAME).share(executor.slots, unit_memory(artifact, params),
                                                                     UNIT_HOLDS)
        return store.build(NAME, VERSION, params.key_params(), upstream,
                           _body(artifact, params, memory, progress, executor), force=force)


def _body(artifact: GraphArtifact, params: Params, memory: MemoryPlan | None, progress: bool,
          executor: Executor | None) -> Callable[[StageWriter], None]:
    """The build: assign, relabel, write the book and the parts (here, or by ``executor``'s units after the
    graph is let go)."""
    def body(writer: StageWriter) -> None:
        plan = memory or memory_plan(artifact, params)
        # KaMinPar on several threads cuts differently every run: what is built on this build must be rebuilt with
        # it (Manifest.upstream_builds)
        writer.reproducible = params.method != "kaminpar" or kaminpar_threads(params.kaminpar_threads) == 1
        with measure() as cost:
            with writer.scratch() as scratch:
                graph = mapped_graph(artifact, scratch) if plan.streamed else \
                    artifact.read(features=False, negatives=True)
                stats = _partition(writer, graph, params, scratch, plan, progress, write_here=executor is None)
                del graph   # the units may share this host: their shares of the budget need its memory
            if executor is not None:
                stats.update(_write_units(executor, writer, artifact.manifest, params.num_partitions, stats))
        writer.summary.update(stats)
        writer.summary.update({**cost, "memory_path": "streamed" if plan.streamed else "in-memory",
                               "memory_estimate_bytes": plan.minimum if plan.streamed else plan.in_memory})
        if plan.phases:   # KaMinPar: the peak phase is the estimate (footprint's module docstring)
            writer.summary.update({"kaminpar_compressed": plan.compress,
                                   "memory_phase_bytes": {name: int(b) for name, b in plan.phases}})

    return body


def _write_units(executor: Executor, writer: StageWriter, download: Manifest, num_parts: int,
                 stats: dict[str, Any]) -> dict[str, Any]:
    """The parts written by ``executor``'s units, one per worker slot; the link figures in part order and the
    executor figures."""
    jobs = [PartsJob(writer.store.root, download, writer.work_dir(), group)
            for group in part_groups(num_parts, executor.slots)]
    results = executor.map(write_parts, jobs, name="partition-unit")
    return {**with_part_lists(stats, *part_lists(results, num_parts)), **unit_figures(results, executor.slots)}


def memory_plan(artifact: GraphArtifact, params: Params) -> MemoryPlan:
    """The stage's memory plan for this graph (``stages.partition.footprint``), from the manifest and the Zarr
    arrays' shapes only; InputError (one line) when the budget cannot hold even the streamed path."""
    schema = artifact.schema
    indptr, indices = artifact.zarr_array("indptr"), artifact.zarr_array("indices")
    link = _link_entries(artifact.summary)
    edge_attr = int(artifact.zarr_array("edge_attr").nbytes) if artifact.num_edge_features else 0
    return plan(MemoryBudget.resolve(params.memory_budget_bytes, NAME), num_nodes=artifact.num_nodes,
                num_entries=int(indices.shape[0]), num_parts=params.num_partitions, method=params.method,
                symmetrise=artifact.summary.directed or not schema.is_homogeneous,
                graph_bytes=int(indptr.nbytes + indices.nbytes), link_bytes=8 * link, edge_attr_bytes=edge_attr)


def unit_memory(artifact: GraphArtifact, params: Params) -> int:
    """One part-writing unit's estimate (``footprint.unit_minimum``), from the manifest and the arrays' shapes."""
    link = _link_entries(artifact.summary)
    return unit_minimum(num_nodes=artifact.num_nodes, num_entries=int(artifact.zarr_array("indices").shape[0]),
                        num_parts=params.num_partitions, num_edge_types=artifact.schema.num_edge_types,
                        link_bytes=8 * link, edge_attr_bytes=int(artifact.zarr_array("edge_attr").nbytes)
                        if artifact.num_edge_features else 0)


def _link_entries(summary: DownloadSummary) -> int:
    """Entries of link prediction's splits and fixed negatives (int64 each), from the download summary."""
    return sum(2 * n for n in summary.edge_split_sizes.values()) + \
        sum(int(np.prod(shape)) for shape in summary.edge_split_neg_shapes.values())


def _partition(writer: StageWriter, graph: Graph, params: Params, scratch: str, plan: MemoryPlan,
               progress: bool, write_here: bool = True) -> dict[str, Any]:
    """Assign, relabel and write: the same computation on both paths (``graph``'s arrays in memory or memory
    maps), so both write the same bytes; returns the summary. ``write_here`` False: the book only (the units
    write the parts), with the link figures' per-part lists left empty."""
    from stages.partition.assign import assign_parts
    from stages.partition.relabel import relabel
    from stages.partition.report import partition_report, typed_report

    schema, num_parts = graph.schema, params.num_partitions
    train_mask = np.zeros(graph.num_nodes, dtype=bool)
    train_mask[graph.splits["train"]] = True
    # typed graphs: METIS sees the homogenised graph (a node's edges of every type), which may repeat a
    # pair under two relations, hence "directed" (the symmetrising path dedups)
    node_indptr = np.ascontiguousarray(graph.node_indptr)
    node_type = None if schema.is_homogeneous else schema.node_type_of_orig()
    assigned: dict[str, Any] = {}
    # streamed: a directed or typed graph's symmetric adjacency by the external sort (plan.sort_bytes > 0)
    part_of_orig = assign_parts(node_indptr, graph.indices, train_mask, num_parts,
                                method=params.method, seed=params.seed,
                                directed=graph.directed or not schema.is_homogeneous,
                                balance_train=params.balance_train, balance_edges=params.balance_edges,
                                progress=progress, node_type=node_type, threads=params.kaminpar_threads,
                                scratch_dir=scratch, compress=plan.compress, sort_budget=plan.sort_bytes or None,
                                stats=assigned)
    stats = partition_report(node_indptr, graph.indices, part_of_orig, train_mask, num_parts)
    if "adjacency_sort_buckets" in assigned:   # in the summary only then: other builds' summaries as before
        stats.update(adjacency_sort_buckets=assigned["adjacency_sort_buckets"], adjacency_sort_bytes=plan.sort_bytes)
    if node_type is not None:
        stats["typed"] = typed_report(graph.indptr, graph.indices, part_of_orig, node_type, schema, num_parts)
    book = relabel(part_of_orig, num_parts, node_type, len(schema.node_types))
    del part_of_orig, node_indptr, train_mask
    write_book(writer, book, {"num_partitions": num_parts, "method": params.method,
                              "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                              "schema": schema.to_dict()})
    if write_here:
        stats.update(write_parts_streamed(writer, graph, book, progress) if plan.streamed else
                     _write_parts(writer, graph, book, progress))
    else:
        stats.update(link_stats(graph, [], []))
    stats.update({"num_partitions": num_parts, "method": params.method, "schema": schema.to_dict(),
                  "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                  "bounds": [int(b) for b in book.bounds],
                  "type_bounds": [int(b) for b in book.range_table().type_bounds]})
    return stats


def _write_parts(writer: StageWriter, graph: Graph, book: PartitionBook, progress: bool) -> dict[str, Any]:
    """Write every ``part-<p>.zarr``; returns the link prediction figures for the summary (none without edge
    splits, so a node graph's summary is as before)."""
    from stages.partition.relabel import build_part_csr, part_edge_orig_pos, part_edge_split_negatives, part_edge_splits

    link_sizes, neg_shapes = [], []
    for p in tqdm(range(book.num_partitions), desc="partition: write parts", disable=not progress, leave=False):
        splits = part_edge_splits(graph.edge_splits, book, p) if graph.edge_splits else None
        negatives = part_edge_split_negatives(graph.edge_split_negatives, graph.edge_splits, graph.link_eval, book,
                                              p) if graph.edge_split_negatives else None
        csr = build_part_csr(graph.indptr, graph.indices, book, p, graph.schema.num_edge_types)
        edge_attr = None if graph.edge_attr is None else \
            graph.edge_attr[part_edge_orig_pos(graph.indptr, graph.indices, book, csr)]
        write_part(writer, csr, num_nodes=book.num_nodes, edge_splits=splits, edge_split_negatives=negatives,
                   edge_attr=edge_attr)
        link_sizes.append({k: int(v.shape[1]) for k, v in (splits or {}).items()})
        neg_shapes.append({k: list(v.shape) for k, v in (negatives or {}).items()})
    return link_stats(graph, link_sizes, neg_shapes)


def report(manifest: Manifest) -> Report:
    s = PartitionSummary.from_json(manifest.summary)
    rows = [{"partition": p, "nodes": s.nodes[p], "edges": s.edges[p], "train_nodes": s.train_nodes[p],
             "gid_range": f"[{s.bounds[p]}, {s.bounds[p + 1]})"} for p in range(s.num_partitions)]
    imb = s.imbalance
    headline = (f"{s.method} into {s.num_partitions}: edge cut {s.edge_cut:,} "
                f"({100 * s.edge_cut_fraction:.1f} %), imbalance nodes {imb['nodes']:.3f} / "
                f"edges {imb['edges']:.3f} / train {imb['train_nodes']:.3f}, {s.wall_s:.1f} s, "
                f"peak {s.peak_rss_bytes / 2**30:.2f} GiB")
    md = (f"## partition `{manifest.key}`\n\n{headline}\n\n{markdown_table(rows)}\n\n"
          f"imbalance = max / mean per constraint.\n")
    if s.typed is not None:
        md += _typed_tables(s.typed, s.num_partitions)
    return Report(headline, rows, md)


def _typed_tables(typed: dict[str, Any], num_parts: int) -> str:
    nodes = [{"node_type": name, **{f"part {p}": f["nodes"][p] for p in range(num_parts)},
              "imbalance": f["imbalance"]} for name, f in typed["node_types"].items()]
    edges = [{"edge_type": key, "edge_cut": f["edge_cut"], "cut_%": round(100 * f["edge_cut_fraction"], 2)}
             for key, f in typed["edge_types"].items()]
    return f"\nPer node type:\n\n{markdown_table(nodes)}\n\nPer edge type:\n\n{markdown_table(edges)}\n"
