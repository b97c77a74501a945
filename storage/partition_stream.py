"""Writing a ``part-<p>.zarr`` chunk by chunk: the partition stage's streamed path (``memory_budget_bytes`` below
the in-memory estimate) writes the same arrays, chunk shapes, attrs and bytes as ``storage.partition.write_part``
with at most one Zarr chunk (64 MiB) of each streamed array pending in memory, never a whole part's CSR.

Why the bytes match: ``zarr_io.write_array`` picks an array's chunk rows from its final length and row size only
(``zarr_io.chunk_rows_for``), and a part's edge count is known from its ``indptr`` (O(n_p)) before any edge is
gathered. So each streamed array is created at its final shape with write_array's chunks and codecs, and filled in
order, one whole chunk per write (the last one partial), exactly the writes write_array makes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from storage.partition import _part_name, id_dtype, part_attrs, write_link_arrays
from storage.writer import StageWriter, WorkDir
from storage.zarr_io import ChunkAppender, create_rows_array, open_group, write_array


def write_part_streamed(writer: StageWriter | WorkDir, part: int, start_gid: int, indptr: np.ndarray,
                        chunks: Iterable[tuple[np.ndarray, np.ndarray | None]], *, num_nodes: int,
                        num_edge_types: int = 1, edge_attr_shape: tuple[int, np.dtype] | None = None,
                        edge_splits: dict[str, np.ndarray] | None = None,
                        edge_split_negatives: dict[str, np.ndarray] | None = None) -> None:
    """``write_part`` of part ``part`` from its ``indptr`` (int64 [n_p*R+1]) and ``chunks``: its neighbour gids in
    row order, block by block, each with its edge attributes (``edge_attr_shape``: ``(D, dtype)`` when the graph
    has them, else the blocks' second item is None)."""
    g = open_group(writer.file_url(_part_name(part)), mode="w")
    indptr = np.asarray(indptr, dtype=np.int64)
    num_edges = int(indptr[-1])
    write_array(g, "indptr", indptr)
    indices = ChunkAppender(create_rows_array(g, "indices", (num_edges,), id_dtype(num_nodes)))
    attr = None if edge_attr_shape is None else ChunkAppender(
        create_rows_array(g, "edge_attr", (num_edges, edge_attr_shape[0]), np.dtype(edge_attr_shape[1])))
    for gids, attrs in chunks:
        indices.append(gids)
        if attr is not None:
            if attrs is None or attrs.shape[0] != gids.shape[0]:
                raise ValueError(f"part {part}: a chunk of {gids.shape[0]} edges came without its edge_attr rows")
            attr.append(attrs)
    indices.close()
    if attr is not None:
        attr.close()
        g.attrs["num_edge_features"] = int(attr.array.shape[1])
    if edge_splits:
        group = g.create_group("edge_split")
        for name, pairs in edge_splits.items():
            write_array(group, name, pairs.astype(np.int64, copy=False))
    g.attrs.update(part_attrs(part, start_gid, (indptr.shape[0] - 1) // num_edge_types, num_edge_types, num_edges,
                              num_nodes))
    write_link_arrays(g, edge_splits, edge_split_negatives)
