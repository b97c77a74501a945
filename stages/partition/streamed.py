"""The partition stage's streamed path, taken when ``memory_budget_bytes`` is below the in-memory estimate
(``stages.partition.footprint``): the graph's ``indptr``/``indices`` (and ``edge_attr``) are spilled from Zarr
into the scratch dir on the artifact root's disk and memory-mapped, so they live in the page cache, not in the
stage's anonymous memory; every pass over them goes in row chunks, and each part is written chunk by chunk
(``storage.partition_stream``), never a whole part's CSR in memory.

Same computation as the in-memory path, on the same values, so the same partition and byte-identical Zarr
arrays (tests/test_partition_stream.py). What stays in memory: the O(N) arrays, the train split, and link
prediction's splits and negatives (budgeted in the plan's minimum). A directed or typed graph's symmetric adjacency,
which the partitioner and the balance repair walk, is built by the external sort (``adjacency.external_symmetric``)
into the scratch dir and memory-mapped too: the in-memory path's ``np.unique`` over both directions' keys (64 B a
graph entry) would not fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from stages.partition.relabel import part_csr_chunks, part_edge_split_negatives, part_edge_splits, rows_edge_orig_pos
from storage.graph import SPLITS, Graph, GraphArtifact
from storage.partition import PartitionBook
from storage.partition_stream import write_part_streamed
from storage.progress import progress as tqdm
from storage.spill import spill_array
from storage.writer import StageWriter, WorkDir
from storage.zarr_io import read_into


def mapped_graph(artifact: GraphArtifact, scratch: str) -> Graph:
    """The download artifact's topology with ``indptr``, ``indices`` (and ``edge_attr``) as read-only memory maps
    in ``scratch`` (``indices`` keeps its stored dtype: int32 from a newer download stage, else int64); the train,
    valid and test splits, the link splits and fixed negatives are read into memory; no features, no labels."""
    s = artifact.summary
    schema = artifact.schema
    link_edge_type, link_eval, neg_shapes = s.link_edge_type, s.link_eval, s.edge_split_neg_shapes
    return Graph(
        schema=schema,
        indptr=spill_array(artifact.zarr_array("indptr"), scratch, "indptr"),
        indices=spill_array(artifact.zarr_array("indices"), scratch, "indices"),
        features={},
        y=np.zeros(0, dtype=np.int64),   # the partition stage reads no labels
        splits={name: read_into(artifact.zarr_array(f"split/{name}")) for name in SPLITS},
        directed=bool(s.directed),
        edge_splits={name: read_into(artifact.zarr_array(f"edge_split/{name}")) for name in SPLITS}
        if link_edge_type is not None else {},
        link_edge_type=None if link_edge_type is None else str(link_edge_type),
        # in SPLITS order, as the download wrote them and the in-memory reader gives them (the manifest's summary
        # sorts its keys: test before valid, which put the parts' attrs in another order)
        edge_split_negatives={name: read_into(artifact.zarr_array(f"edge_split_neg/{name}"))
                              for name in SPLITS if name in neg_shapes},
        link_eval=None if link_eval is None else str(link_eval),
        edge_attr=spill_array(artifact.zarr_array("edge_attr"), scratch, "edge_attr")
        if artifact.num_edge_features else None,
    )


def write_parts_streamed(writer: StageWriter, graph: Graph, book: PartitionBook, progress: bool) -> dict[str, Any]:
    """``stage._write_parts`` in chunks: each part's rows come from the memory-mapped CSR in row order (a part
    lists its nodes in ascending orig ids, ``relabel``) and go to disk one chunk of entries at a time."""
    link_sizes, neg_shapes = write_streamed(writer, graph, book, range(book.num_partitions), progress)
    return link_stats(graph, link_sizes, neg_shapes)


def write_streamed(out: StageWriter | WorkDir, graph: Graph, book: PartitionBook, parts: Iterable[int],
                   progress: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write the stores of ``parts`` into ``out`` (the stage's writer, or a unit's ``WorkDir``); returns each one's
    edge split sizes and fixed negatives' shapes (``link_stats``' lists), in the order of ``parts``."""
    r = graph.schema.num_edge_types
    link_sizes, neg_shapes = [], []
    for p in tqdm(parts, desc="partition: write parts", disable=not progress, leave=False):
        splits = part_edge_splits(graph.edge_splits, book, p) if graph.edge_splits else None
        negatives = part_edge_split_negatives(graph.edge_split_negatives, graph.edge_splits, graph.link_eval, book,
                                              p) if graph.edge_split_negatives else None
        part_indptr, chunks = part_csr_chunks(graph.indptr, graph.indices, book, p, r)
        edge_attr = graph.edge_attr
        write_part_streamed(out, p, int(book.bounds[p]), part_indptr,
                            _with_attrs(graph, book, p, part_indptr, chunks), num_nodes=book.num_nodes,
                            num_edge_types=r, edge_splits=splits, edge_split_negatives=negatives,
                            edge_attr_shape=None if edge_attr is None else (int(edge_attr.shape[1]),
                                                                            edge_attr.dtype))
        link_sizes.append({k: int(v.shape[1]) for k, v in (splits or {}).items()})
        neg_shapes.append({k: list(v.shape) for k, v in (negatives or {}).items()})
    return link_sizes, neg_shapes


def _with_attrs(graph: Graph, book: PartitionBook, p: int, part_indptr: np.ndarray,
                chunks: Iterator[tuple[int, int, np.ndarray]]) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Each chunk's gids with its edges' attributes (laid out like the part's rows), when the graph has them."""
    for l0, l1, gids in chunks:
        if graph.edge_attr is None:
            yield gids, None
        else:
            pos = rows_edge_orig_pos(graph.indptr, graph.indices, book, p, l0, l1, part_indptr, gids,
                                     graph.schema.num_edge_types)
            yield gids, np.asarray(graph.edge_attr[pos])


def link_stats(graph: Graph, link_sizes: list[dict[str, Any]], neg_shapes: list[dict[str, Any]]
               ) -> dict[str, Any]:
    """The parts' link prediction and edge feature figures for the summary (absent for a node graph)."""
    stats: dict[str, Any] = {}
    if graph.edge_splits:   # link prediction: each part's seed edges (those whose dst it owns)
        stats["link_edge_type"], stats["edge_split_sizes"] = graph.link_edge_type, link_sizes
    if graph.edge_attr is not None:   # in the summary only then: node graphs' summaries as before
        stats["num_edge_features"] = graph.num_edge_features
    if graph.edge_split_negatives:   # OGB's fixed evaluation negatives, with their dst owners
        stats["link_eval"], stats["edge_split_neg_shapes"] = graph.link_eval, neg_shapes
    return stats


def with_part_lists(stats: dict[str, Any], link_sizes: list[dict[str, Any]], neg_shapes: list[dict[str, Any]]
                    ) -> dict[str, Any]:
    """``link_stats``' figures taken before the parts were written (with empty lists), with the parts' lists in
    (the units wrote them, ``stages.partition.units``)."""
    out = dict(stats)
    if "edge_split_sizes" in out:
        out["edge_split_sizes"] = link_sizes
    if "edge_split_neg_shapes" in out:
        out["edge_split_neg_shapes"] = neg_shapes
    return out
