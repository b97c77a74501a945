"""Partition stage: graph.zarr → METIS (KaMinPar, random) parts, relabelled to contiguous gid ranges.

Contract: download manifest + params → artifact ``partition/<key>/`` with ``book.zarr`` (bounds, orig_of_gid,
gid_of_orig) and ``part-<p>.zarr`` (incoming-edge CSR over lids, neighbour gids); format in ``storage.partition``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from stages.choices import PartitionMethod
from stages.meter import measure
from stages.params import BudgetedParams, Seed, runtime
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.graph import Graph, GraphArtifact
from storage.partition import PartitionBook, write_book, write_part
from storage.progress import progress as tqdm
from storage.report import Report, markdown_table

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
    from stages.partition.assign import assign_parts
    from stages.partition.relabel import relabel
    from stages.partition.report import partition_report, typed_report

    download = upstream["download"]
    num_nodes = GraphArtifact(store, download).num_nodes
    if params.num_partitions > num_nodes:
        raise InputError(f"num_partitions={params.num_partitions} exceeds the graph's {num_nodes} nodes; "
                         f"choose 1..{num_nodes}")

    def body(writer: StageWriter) -> None:
        with measure() as cost:
            graph = GraphArtifact(store, download).read(features=False, negatives=True)
            schema, num_parts = graph.schema, params.num_partitions
            train_mask = np.zeros(graph.num_nodes, dtype=bool)
            train_mask[graph.splits["train"]] = True
            # typed graphs: METIS sees the homogenised graph (a node's edges of every type), which may repeat a
            # pair under two relations, hence "directed" (the symmetrising path dedups)
            node_indptr = np.ascontiguousarray(graph.node_indptr)
            node_type = None if schema.is_homogeneous else schema.node_type_of_orig()
            part_of_orig = assign_parts(node_indptr, graph.indices, train_mask, num_parts,
                                        method=params.method, seed=params.seed,
                                        directed=graph.directed or not schema.is_homogeneous,
                                        balance_train=params.balance_train, balance_edges=params.balance_edges,
                                        progress=progress, node_type=node_type, threads=params.kaminpar_threads)
            stats = partition_report(node_indptr, graph.indices, part_of_orig, train_mask, num_parts)
            if node_type is not None:
                stats["typed"] = typed_report(graph.indptr, graph.indices, part_of_orig, node_type, schema,
                                              num_parts)
            book = relabel(part_of_orig, num_parts, node_type, len(schema.node_types))
            del part_of_orig, node_indptr
            write_book(writer, book, {"num_partitions": num_parts, "method": params.method,
                                      "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                                      "schema": schema.to_dict()})
            stats.update(_write_parts(writer, graph, book, progress))
        writer.summary.update(stats)
        writer.summary.update({"num_partitions": num_parts, "method": params.method, "schema": schema.to_dict(),
                               "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                               "bounds": [int(b) for b in book.bounds],
                               "type_bounds": [int(b) for b in book.range_table().type_bounds], **cost})

    return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


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
        write_part(writer, csr, edge_splits=splits, edge_split_negatives=negatives, edge_attr=edge_attr)
        link_sizes.append({k: int(v.shape[1]) for k, v in (splits or {}).items()})
        neg_shapes.append({k: list(v.shape) for k, v in (negatives or {}).items()})
    stats: dict[str, Any] = {}
    if graph.edge_splits:   # link prediction: each part's seed edges (those whose dst it owns)
        stats["link_edge_type"], stats["edge_split_sizes"] = graph.link_edge_type, link_sizes
    if graph.edge_attr is not None:   # in the summary only then: node graphs' summaries as before
        stats["num_edge_features"] = graph.num_edge_features
    if graph.edge_split_negatives:   # OGB's fixed evaluation negatives, with their dst owners
        stats["link_eval"], stats["edge_split_neg_shapes"] = graph.link_eval, neg_shapes
    return stats


def report(manifest: Manifest) -> Report:
    s: dict[str, Any] = manifest.summary
    rows = [{"partition": p, "nodes": s["nodes"][p], "edges": s["edges"][p], "train_nodes": s["train_nodes"][p],
             "gid_range": f"[{s['bounds'][p]}, {s['bounds'][p + 1]})"} for p in range(s["num_partitions"])]
    imb = s["imbalance"]
    headline = (f"{s['method']} into {s['num_partitions']}: edge cut {s['edge_cut']:,} "
                f"({100 * s['edge_cut_fraction']:.1f} %), imbalance nodes {imb['nodes']:.3f} / "
                f"edges {imb['edges']:.3f} / train {imb['train_nodes']:.3f}, {s['wall_s']:.1f} s, "
                f"peak {s['peak_rss_bytes'] / 2**30:.2f} GiB")
    md = (f"## partition `{manifest.key}`\n\n{headline}\n\n{markdown_table(rows)}\n\n"
          f"imbalance = max / mean per constraint.\n")
    if "typed" in s:
        md += _typed_tables(s["typed"], s["num_partitions"])
    return Report(headline, rows, md)


def _typed_tables(typed: dict[str, Any], num_parts: int) -> str:
    nodes = [{"node_type": name, **{f"part {p}": f["nodes"][p] for p in range(num_parts)},
              "imbalance": f["imbalance"]} for name, f in typed["node_types"].items()]
    edges = [{"edge_type": key, "edge_cut": f["edge_cut"], "cut_%": round(100 * f["edge_cut_fraction"], 2)}
             for key, f in typed["edge_types"].items()]
    return f"\nPer node type:\n\n{markdown_table(nodes)}\n\nPer edge type:\n\n{markdown_table(edges)}\n"
