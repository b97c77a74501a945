"""Relabel orig ids to gids (each part a contiguous gid range) and cut the graph into per-part CSRs in gids."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stages.partition.csr_ops import chunk_rows, degrees, gather_positions, row_chunks
from storage.partition import PartCSR, PartitionBook
from storage.schema import RangeTable

# Up to this many parts a part's rows are found by a masked pass over the whole CSR and re-sorted by a per-part
# scatter (P linear passes each); beyond, by a segment gather and a sort.
SCATTER_MAX_PARTS = 16


def relabel(part_of_orig: np.ndarray, num_parts: int, node_type: np.ndarray | None = None,
            num_types: int = 1) -> PartitionBook:
    """The ``PartitionBook`` for an assignment: part p owns gids ``[bounds[p], bounds[p+1])`` and, within a part,
    gids follow orig order (a stable sort), so the relabelling is deterministic and locality is kept.

    Orig ids number the node types one after another, so within a part gids follow (type, orig) and each type
    is a sub-range: ``node_type`` (int [N] in [0, num_types), typed graphs) only counts them into
    ``type_bounds``."""
    part_of_orig = np.asarray(part_of_orig)
    num_nodes = int(part_of_orig.shape[0])
    if num_nodes and (int(part_of_orig.min()) < 0 or int(part_of_orig.max()) >= num_parts):
        raise ValueError(f"part ids must lie in [0, {num_parts}), got [{part_of_orig.min()}, {part_of_orig.max()}]")
    # A stable argsort of a <= 16-bit key is a radix sort in numpy: O(N) instead of O(N log N) for int64.
    key = part_of_orig.astype(np.int16) if num_parts <= np.iinfo(np.int16).max else part_of_orig
    orig_of_gid = np.argsort(key, kind="stable").astype(np.int64, copy=False)
    gid_of_orig = np.empty(num_nodes, dtype=np.int64)
    gid_of_orig[orig_of_gid] = np.arange(num_nodes, dtype=np.int64)
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(part_of_orig, minlength=num_parts), out=bounds[1:])
    if node_type is None:
        return PartitionBook(bounds=bounds, orig_of_gid=orig_of_gid, gid_of_orig=gid_of_orig)
    if num_nodes and np.any(np.diff(node_type) < 0):
        raise ValueError("node types must number the orig ids type after type (storage.graph)")
    counts = np.bincount(part_of_orig * num_types + node_type, minlength=num_parts * num_types)
    table = RangeTable.from_counts(counts.reshape(num_parts, num_types))
    return PartitionBook(bounds=bounds, orig_of_gid=orig_of_gid, gid_of_orig=gid_of_orig,
                         type_bounds=table.type_bounds)


def part_edge_splits(edge_splits: dict[str, np.ndarray], book: PartitionBook, p: int) -> dict[str, np.ndarray]:
    """Link prediction's split positives (orig ``[2, E]``) that part p holds, in gids: those whose dst it owns,
    sorted by (dst, src) (a rank's seed edges, in the order of its nodes)."""
    out = {}
    for name, pairs in edge_splits.items():
        gid = book.gid_of_orig[pairs]
        out[name] = gid[:, _owned_in_order(gid, book, p)]
    return out


def part_edge_split_negatives(negatives: dict[str, np.ndarray], edge_splits: dict[str, np.ndarray],
                              link_eval: str | None, book: PartitionBook, p: int) -> dict[str, np.ndarray]:
    """The fixed evaluation negatives (orig, ``storage.graph``'s layouts) that part p holds, in gids, with the
    owner of the dst: a per-positive row goes with its positive (``part_edge_splits``' selection and order, so row
    i still belongs to positive i); shared pairs are selected and sorted as positives are."""
    out = {}
    for name, neg in negatives.items():
        if link_eval == "per-positive":
            out[name] = book.gid_of_orig[neg[_owned_in_order(book.gid_of_orig[edge_splits[name]], book, p)]]
        else:
            gid = book.gid_of_orig[neg]
            out[name] = gid[:, _owned_in_order(gid, book, p)]
    return out


def _owned_in_order(gid_pairs: np.ndarray, book: PartitionBook, p: int) -> np.ndarray:
    """The columns of ``[2, E]`` gid pairs whose dst part p owns, in (dst, src) order (lexsort is stable: ties
    keep the dataset's order)."""
    lo, hi = int(book.bounds[p]), int(book.bounds[p + 1])
    cols = np.flatnonzero((gid_pairs[1] >= lo) & (gid_pairs[1] < hi))
    return cols[np.lexsort((gid_pairs[0, cols], gid_pairs[1, cols]))]


def build_part_csr(indptr: np.ndarray, indices: np.ndarray, book: PartitionBook, p: int,
                   num_edge_types: int = 1) -> PartCSR:
    """Part p's incoming-edge CSR: rows are its (lid, edge type) pairs, ``lid * R + e`` (``storage.graph``'s row
    layout), entries are neighbour gids, sorted per row.

    Built per part and in row chunks (``part_csr_chunks``), so besides the output only ~16 M entries' worth of
    temporaries live at once (the whole graph in gids is never materialised).
    """
    part_indptr, chunks = part_csr_chunks(indptr, indices, book, p, num_edge_types)
    nbr_gid_out = np.empty(int(part_indptr[-1]), dtype=np.int64)
    for l0, l1, nbr_gid in chunks:
        nbr_gid_out[part_indptr[l0]:part_indptr[l1]] = nbr_gid
    return PartCSR(part=p, start_gid=int(book.bounds[p]), indptr=part_indptr, indices=nbr_gid_out,
                   num_edge_types=num_edge_types)


def part_csr_chunks(indptr: np.ndarray, indices: np.ndarray, book: PartitionBook, p: int, num_edge_types: int = 1
                    ) -> tuple[np.ndarray, Iterator[tuple[int, int, np.ndarray]]]:
    """Part p's ``indptr`` (int64, O(n_p)) and its rows' neighbour gids as ``(row0, row1, gids)`` chunks of about
    ``csr_ops.CHUNK_EDGES`` entries, in row order: ``build_part_csr`` without the whole part in memory (the
    streamed path writes each chunk as it comes, ``storage.partition_stream``)."""
    r = num_edge_types
    start_gid, stop_gid = int(book.bounds[p]), int(book.bounds[p + 1])
    orig_row_of_row = _orig_rows(book.orig_of_gid[start_gid:stop_gid], r)
    part_indptr = np.zeros(orig_row_of_row.shape[0] + 1, dtype=np.int64)
    np.cumsum(indptr[orig_row_of_row + 1] - indptr[orig_row_of_row], out=part_indptr[1:])
    del orig_row_of_row

    def chunks() -> Iterator[tuple[int, int, np.ndarray]]:
        for l0, l1, nbr_orig in _rows_of_part(indptr, indices, book, p, part_indptr, r):
            sub_indptr = part_indptr[l0:l1 + 1] - part_indptr[l0]
            yield l0, l1, _sort_rows(sub_indptr, book.gid_of_orig[nbr_orig], book.bounds)

    return part_indptr, chunks()


def part_edge_orig_pos(indptr: np.ndarray, indices: np.ndarray, book: PartitionBook, part: PartCSR) -> np.ndarray:
    """int64 [e_p]: for each edge of ``part`` (``build_part_csr``'s output, in its order) its position in the orig
    CSR ``indices``, so that ``edge_attr[orig_epos]`` lays the graph's edge attributes out like the part."""
    return rows_edge_orig_pos(indptr, indices, book, part.part, 0, part.indptr.shape[0] - 1, part.indptr,
                              part.indices, part.num_edge_types)


def rows_edge_orig_pos(indptr: np.ndarray, indices: np.ndarray, book: PartitionBook, p: int, row0: int, row1: int,
                       part_indptr: np.ndarray, nbr_gid_rows: np.ndarray, num_edge_types: int = 1) -> np.ndarray:
    """``part_edge_orig_pos`` for part p's rows ``[row0, row1)`` only (``nbr_gid_rows``: their entries, as
    ``part_csr_chunks`` yields them), so the streamed path lays out edge attributes chunk by chunk.

    A part's row is its orig row re-sorted by gid: the orig positions of its rows, stably sorted by (row, neighbour
    gid). One sort of the rows' edges (rows are distinct neighbours, so the order is unique), paid only by graphs
    with edge features; checked against the part's ``indices``, the one truth of the order."""
    r = num_edge_types
    row = np.arange(row0, row1, dtype=np.int64)   # (lid, edge type) rows of the part
    orig_rows = book.orig_of_gid[int(book.bounds[p]) + row // r] * r + row % r
    del row
    _, orig_epos = gather_positions(indptr, orig_rows)
    sub_indptr = part_indptr[row0:row1 + 1] - part_indptr[row0]
    rows = chunk_rows(sub_indptr, 0, row1 - row0)
    nbr_gid = book.gid_of_orig[indices[orig_epos]]
    orig_epos = orig_epos[np.lexsort((nbr_gid, rows))]
    if not np.array_equal(book.gid_of_orig[indices[orig_epos]], nbr_gid_rows):
        raise ValueError(f"part {p}'s CSR does not list its rows' edges sorted by gid")
    return orig_epos


def _orig_rows(orig_of_lid: np.ndarray, num_edge_types: int) -> np.ndarray:
    """The orig CSR rows of some nodes' (node, edge type) rows, in (node, edge type) order."""
    if num_edge_types == 1:
        return orig_of_lid
    return (orig_of_lid[:, None] * num_edge_types + np.arange(num_edge_types)).reshape(-1)


def _rows_of_part(indptr: np.ndarray, indices: np.ndarray, book: PartitionBook, p: int,
                  part_indptr: np.ndarray, num_edge_types: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(row0, row1, neighbour orig ids of those part rows)`` chunk by chunk, in part row order.

    A book made by ``relabel`` lists a part's nodes in ascending orig order, so the part's rows are a masked,
    sequential pass over the orig CSR (measured 0.5 s for 60 M entries, against 2.7 s for a segment gather by
    row). That pass reads the whole graph for each part, so many parts, or any other book, take the gather.
    """
    r = num_edge_types
    start_gid, stop_gid = int(book.bounds[p]), int(book.bounds[p + 1])
    orig_of_lid = book.orig_of_gid[start_gid:stop_gid]
    if book.num_partitions <= SCATTER_MAX_PARTS and np.all(orig_of_lid[1:] > orig_of_lid[:-1]):
        deg = degrees(indptr)
        row0 = 0
        for r0, r1 in row_chunks(indptr):
            gid = book.gid_of_orig[r0:r1] if r == 1 else book.gid_of_orig[np.arange(r0, r1) // r]
            own = (gid >= start_gid) & (gid < stop_gid)
            num_rows = int(np.count_nonzero(own))
            if num_rows:
                yield row0, row0 + num_rows, indices[indptr[r0]:indptr[r1]][np.repeat(own, deg[r0:r1])]
                row0 += num_rows
        return
    for l0, l1 in row_chunks(part_indptr):
        _, pos = gather_positions(indptr, _orig_rows(orig_of_lid, r)[l0:l1])
        yield l0, l1, indices[pos]


def _sort_rows(sub_indptr: np.ndarray, nbr_gid: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sort every row of a CSR chunk whose rows were sorted in orig ids.

    Within a part, gids follow orig order, so each row is already P sorted runs (one per part) interleaved, and
    a sorted row is just its part-0 entries, then its part-1 entries, ...: a stable scatter, P cheap passes
    (a sort of (row, gid) keys measured ~8 s per 60 M entries on the benchmark machine of benchmarks/RESULTS.md,
    where the whole partition stage takes 30.7 s: [1/5], row "partition", 2 parts). Many parts: the plain sort.
    """
    num_parts = int(bounds.shape[0] - 1)
    num_rows = int(sub_indptr.shape[0] - 1)
    rows = chunk_rows(sub_indptr, 0, num_rows)
    if num_parts > SCATTER_MAX_PARTS:
        return _sort_by_row_and_gid(rows, nbr_gid, int(bounds[-1]))
    out = np.empty_like(nbr_gid)
    next_free = sub_indptr[:-1].copy()  # per row: where its next part's run starts
    nbr_part = np.searchsorted(bounds, nbr_gid, side="right") - 1
    for q in range(num_parts):
        entries = np.flatnonzero(nbr_part == q)
        if entries.shape[0] == 0:
            continue
        entry_rows = rows[entries]
        per_row = np.bincount(entry_rows, minlength=num_rows)
        run_start = np.cumsum(per_row) - per_row
        # rank within the row's part-q run = position among part-q entries - where that row's run begins
        rank = np.arange(entries.shape[0], dtype=np.int64) - run_start[entry_rows]
        out[next_free[entry_rows] + rank] = nbr_gid[entries]
        next_free += per_row
    # The scatter relies on the graph's rows being sorted (storage.graph's contract); check, and sort otherwise.
    if not np.all((out[1:] >= out[:-1]) | (rows[1:] != rows[:-1])):
        return _sort_by_row_and_gid(rows, nbr_gid, int(bounds[-1]))
    return out


def _sort_by_row_and_gid(rows: np.ndarray, nbr_gid: np.ndarray, num_nodes: int) -> np.ndarray:
    key = rows * num_nodes + nbr_gid
    key.sort()
    key -= rows * num_nodes  # the sort keeps rows grouped and in order, so ``rows`` still matches
    return key
