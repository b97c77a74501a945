"""The link split of a graph larger than memory: ``edge_split.split_edges``'s splits and message-passing CSR, byte
for byte, from a CSR whose ``indices`` is a memory map (``external_sort``'s), read in row chunks.

``split_edges`` holds ~120 bytes per CSR entry (13.7 GiB at 120 M entries; 117 B measured at 3 M: int64 entry,
src and dst copies, the stacked pairs, the permutation, two ``np.isin`` sorts over every entry). Here, four
sequential passes over ``indices``. A typed CSR's rows are (node, edge type), ``v * R + e`` (``storage.graph``): the
pairs are the entries of the rows ``v * R + e`` of the target type e, and a homogeneous graph is R = 1, e = 0 (every
row a target row), the same code:

1. count the pairs P (a symmetrised type's ``u < v`` entries, every entry of a directed one), in CSR order: by
   destination node, then source, the order ``split_edges`` numbers them in; a directed type's P is its rows'
   lengths, read from ``indptr`` alone;
2. the held-out positions. ``split_edges`` draws ``default_rng(seed).permutation(P)`` and holds out its first
   ``n_valid + n_test`` entries (``split_sizes``). ``Generator.permutation(int)`` is ``np.arange`` then
   ``shuffle`` (numpy's source; tests/test_download_stream.py checks it), whose Fisher-Yates draws depend on the
   length alone, not on the dtype or the buffer: so the same permutation is shuffled in place in an ``arange``
   memory-mapped from the scratch directory, int32 below 2^31 pairs: 4 P bytes of page cache and disk (240 MB at
   120 M symmetrised entries, removed once read) instead of 8 P of anonymous memory (480 MB there), which a
   budget in the streaming minimum would have cost. It is shuffled through a plain ``ndarray`` view: numpy takes
   its C path for ``type(x) is np.ndarray`` only, and a ``np.memmap`` falls to a Python loop 270x slower. The
   shuffle's swaps are random: while the 4 P bytes stay in the page cache they cost what they cost in memory;
   past the free memory (P of billions) each would be a disk read, the limit of this choice;
3. the pairs: held-out ones gathered in memory (valid and test are ``1 - train`` of P, int64 as ``split_edges``
   returns them), the rest, in order (``split_edges``'s sorted train positions), appended to a spill file of
   (src, dst) rows: the train split is its transposed memory map, which ``write_graph`` writes column chunk by
   column chunk (``zarr_io.write_columns``);
4. the message-passing CSR: an entry is dropped when its pair is held out: a target-type entry ``u -> v`` whose
   pair is held (either direction when symmetric: a held pair ``u < v`` leaves ``u -> v`` and ``v -> u``, and
   ``v -> u`` sits in an earlier row, hence after pass 3), and an entry ``v -> u`` of the target's reverse type
   (``edge_split.reverse_type``: ``rev_<rel>``, which ``add_reverse`` made, or the forward type of a ``rev_``
   target) whose forward pair ``u -> v`` is held, as ``split_edges`` drops them from the whole CSR; the kept
   sources of every type appended to a new spill file, ``indptr`` rewritten in place (no second 8 N R).

Memory beyond the caller's O(N R) arrays: ``HELD_PAIR_BYTES`` per held-out pair (the split's own outputs and their
keys) and ``SCAN_BYTES_PER_ENTRY`` per entry of a row chunk, chunks sized to what the budget leaves. Graphs without
edge features only (``split_edges`` takes their rows along; nothing here reads them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stages.download.edge_split import check_link_split, reverse_type, split_sizes
from stages.external_sort import row_ranges
from storage import spill
from storage.graph import Graph, index_dtype

# per held-out pair: its (src, dst) int64 16 (the valid/test outputs) + its position int64 8 (passes 2-3, sorted in
# place) or its key int64 8 (pass 4, sorted in place), + 8 for a product in flight while the keys are made: 32
HELD_PAIR_BYTES = 32
# per entry of a row chunk, pass 4 (the largest), at its peak, the lookup: the chunk's destination ids 4 and type
# masks 2, (typed) the looked-up entries' positions 8 and their ends 8, the int64 key 8, its searchsorted positions
# 8, the gathered keys 8 and their match 1 = 47 (making the keys: the narrowed ends and one swapped in, 12, before
# the searchsorted; the spill after it: masks 3, kept sources 4, dropped positions 8). Per row, where rows are nearly
# empty (a chunk has at most as many rows as entries): its ends 8, live through the chunk, and the dropped count
# before each 8 (while the chunk is cut: counts 8, ids and edge types 16, their narrowed copy 4): 47 + 16 = 63,
# rounded up
SCAN_BYTES_PER_ENTRY = 72
MIN_SCAN_ENTRIES = 1 << 12   # a floor, so that a budget near the minimum still makes progress


@dataclass(frozen=True)
class _Types:
    """Which rows the split reads: ``r`` edge types (row ``v * r + e``), the ``target`` type's pairs and the
    entries of its ``reverse`` type (None: the graph has none)."""

    r: int
    target: int
    reverse: int | None


@dataclass(frozen=True)
class _Chunk:
    """Rows ``[row, end)`` of the CSR and their entries ``[start, ends[-1])``."""

    row: int
    end: int
    start: int
    ends: np.ndarray              # int64: each row's entry end, read before pass 4 rewrites indptr
    src: np.ndarray               # the entries' sources: a view of indices (the memory map's pages, no copy)
    dst: np.ndarray               # the entries' destination nodes ``v`` of row ``v * R + e``, index dtype
    target: np.ndarray | None     # per entry, whether it is of the target type; None: every entry is
    reverse: np.ndarray | None    # per entry, whether it is of the reverse type; None: no entry is


def split_edges_streamed(graph: Graph, edge_type: int, fractions: tuple[float, float, float], seed: int, *,
                         budget_bytes: int, scratch: str) -> tuple[Graph, dict[str, Any]]:
    """``split_edges(graph, edge_type, fractions, seed)[0]`` (module docstring) within ``budget_bytes`` of anonymous
    memory beyond the caller's, and the split's figures for the summary. ``graph`` is consumed: its ``indptr``
    becomes the message-passing graph's; the new ``indices`` and the train split are memory maps in ``scratch``."""
    check_link_split(fractions)
    if graph.edge_attr is not None:
        raise ValueError("the streamed link split takes a graph without edge features")
    et = graph.schema.edge_types[edge_type]
    symmetric = et.src == et.dst and not graph.directed   # split_edges's undirected pairs
    reverse = reverse_type(graph, edge_type)
    types = _Types(graph.schema.num_edge_types, edge_type, None if reverse == edge_type else reverse)
    num_pairs = _count_pairs(graph, types, symmetric, _chunk_entries(budget_bytes, 0))
    n_valid, n_test = split_sizes(num_pairs, fractions)
    per_chunk = _chunk_entries(budget_bytes, n_valid + n_test)
    valid_pos, test_pos = _held_positions(num_pairs, n_valid, n_test, seed, scratch, per_chunk)
    train_path, mp_path = (os.path.join(scratch, f"link-{name}.raw") for name in ("train", "indices"))
    train, held = _pair_pass(graph, types, symmetric, {"valid": valid_pos, "test": test_pos}, per_chunk, train_path)
    del valid_pos, test_pos
    chunks = sum(1 for _ in row_ranges(graph.indptr, per_chunk))   # before pass 4 rewrites indptr
    indices = _message_passing(graph, types, symmetric, _held_keys(held, graph.num_nodes), per_chunk, mp_path)
    splits = {"train": train, **held}
    permutation = num_pairs * _permutation_dtype(num_pairs).itemsize
    info = {"link_split_chunks": chunks, "link_spill_bytes": int(permutation + train.nbytes + indices.nbytes)}
    return replace(graph, indices=indices, edge_splits=splits, link_edge_type=et.key), info


def _chunk_entries(budget_bytes: int, held: int) -> int:
    return max(MIN_SCAN_ENTRIES, (budget_bytes - HELD_PAIR_BYTES * held) // SCAN_BYTES_PER_ENTRY)


def _row_chunks(graph: Graph, types: _Types, per_chunk: int) -> Iterator[_Chunk]:
    """The CSR's row chunks of about ``per_chunk`` entries (and at most as many rows). The ranges and each chunk's
    row ends are read before the chunk is yielded, so that ``_message_passing`` may rewrite ``indptr`` behind the
    scan."""
    indptr = graph.indptr
    start = int(indptr[0])
    for row, end in list(row_ranges(indptr, per_chunk)):
        ends = indptr[row + 1:end + 1].copy()
        yield _chunk(graph, types, row, end, start, ends)
        start = int(ends[-1])


def _chunk(graph: Graph, types: _Types, row: int, end: int, start: int, ends: np.ndarray) -> _Chunk:
    """Rows ``[row, end)``'s entries with their destination nodes and type masks, computed per row and repeated per
    entry (a row's entries share both): its temporaries go when it returns."""
    counts = np.diff(ends, prepend=start)
    node = np.arange(row, end, dtype=np.int64)   # row ids reach N * R: int64 even when the node ids fit int32
    edge_type = node % types.r
    node //= types.r
    dst = np.repeat(node.astype(index_dtype(graph.num_nodes)), counts)
    is_target = edge_type == types.target
    target = None if is_target.all() else np.repeat(is_target, counts)   # R = 1: every row, no mask
    is_reverse = None if types.reverse is None else edge_type == types.reverse
    reverse = None if is_reverse is None or not is_reverse.any() else np.repeat(is_reverse, counts)
    return _Chunk(row, end, start, ends, np.asarray(graph.indices[start:int(ends[-1])]), dst, target, reverse)


def _count_pairs(graph: Graph, types: _Types, symmetric: bool, per_chunk: int) -> int:
    if symmetric:   # counted, not gathered: a copy of the pairs cost 0.24 s of 5 at 1 M nodes, 10 M entries
        return sum(_pair_count(chunk, symmetric) for chunk in _row_chunks(graph, types, per_chunk))
    indptr, r, rows = graph.indptr, types.r, graph.indptr.shape[0] - 1
    pairs = 0
    for lo in range(types.target, rows, r * per_chunk):   # every entry of a target row: its rows' lengths
        hi = min(rows, lo + r * per_chunk)
        pairs += int((indptr[lo + 1:hi + 1:r] - indptr[lo:hi:r]).sum())
    return pairs


def _held_positions(num_pairs: int, n_valid: int, n_test: int, seed: int, scratch: str, block: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The sorted pair positions of the valid and test splits: the first ``n_valid`` and the next ``n_test``
    entries of ``default_rng(seed).permutation(num_pairs)``, shuffled on disk (module docstring, pass 2)."""
    path = os.path.join(scratch, "link-permutation.raw")
    dtype = _permutation_dtype(num_pairs)
    open(path, "wb").close()
    for lo in range(0, num_pairs, block):   # written, not mapped writable: a full disk is an OSError, not SIGBUS
        spill.spill_append(path, np.arange(lo, min(num_pairs, lo + block), dtype=dtype))
    held = []
    if num_pairs:
        order = np.memmap(path, dtype=dtype, mode="r+", shape=(num_pairs,))
        np.random.default_rng(seed).shuffle(order.view(np.ndarray))   # the C path (module docstring)
        for lo, hi in ((0, n_valid), (n_valid, n_valid + n_test)):
            held.append(order[lo:hi].astype(np.int64))
            held[-1].sort()
        del order
    os.remove(path)
    return (held[0], held[1]) if held else (np.empty(0, np.int64), np.empty(0, np.int64))


def _permutation_dtype(num_pairs: int) -> np.dtype:
    """int32 while every position fits: the draws do not depend on it (module docstring, pass 2)."""
    return np.dtype(np.int32 if num_pairs < 2**31 else np.int64)


def _pair_mask(chunk: _Chunk, symmetric: bool) -> np.ndarray | None:
    """Which of a chunk's entries are pairs: its target-type entries, of them the ``u < v`` ones when symmetric
    (None: every entry)."""
    keep = chunk.target
    if symmetric:
        half = chunk.src < chunk.dst
        keep = half if keep is None else np.logical_and(half, keep, out=half)
    return keep


def _pair_count(chunk: _Chunk, symmetric: bool) -> int:
    keep = _pair_mask(chunk, symmetric)
    return chunk.src.shape[0] if keep is None else int(np.count_nonzero(keep))


def _pairs(chunk: _Chunk, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's pairs in order (``_pair_mask``)."""
    keep = _pair_mask(chunk, symmetric)
    return (chunk.src, chunk.dst) if keep is None else (chunk.src[keep], chunk.dst[keep])


def _pair_pass(graph: Graph, types: _Types, symmetric: bool, positions: dict[str, np.ndarray], per_chunk: int,
               train_path: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the train pairs, an index-dtype [2, E_train] memory map; {split: int64 [2, E_s]} of the held-out ones)."""
    held = {name: np.empty((2, pos.shape[0]), dtype=np.int64) for name, pos in positions.items()}
    ids = index_dtype(graph.num_nodes)
    open(train_path, "wb").close()
    first = 0   # the position of the chunk's first pair
    for chunk in _row_chunks(graph, types, per_chunk):
        src, dst = _pairs(chunk, symmetric)
        is_train = np.ones(src.shape[0], dtype=bool)
        for name, pos in positions.items():
            lo, hi = np.searchsorted(pos, (first, first + src.shape[0]))
            at = pos[lo:hi] - first
            held[name][0, lo:hi], held[name][1, lo:hi] = src[at], dst[at]
            is_train[at] = False
        spill.spill_append(train_path, np.stack([src[is_train], dst[is_train]], axis=1).astype(ids, copy=False))
        first += src.shape[0]
    count = first - sum(pos.shape[0] for pos in positions.values())
    train = np.memmap(train_path, dtype=ids, mode="r", shape=(count, 2)).T if count else np.empty((2, 0), ids)
    return train, held


def _held_keys(held: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Sorted int64 keys ``src * n + dst`` of the held-out pairs (``split_edges``'s ``held_key``)."""
    keys = np.concatenate([pairs[0] * n + pairs[1] for pairs in held.values()])
    keys.sort()
    return keys


def _message_passing(graph: Graph, types: _Types, symmetric: bool, held_keys: np.ndarray, per_chunk: int,
                     path: str) -> np.ndarray:
    """The CSR without the held-out pairs' entries (module docstring, pass 4): ``graph.indptr`` rewritten in place,
    the new ``indices`` returned as a memory map of ``path``."""
    ids = index_dtype(graph.num_nodes)
    open(path, "wb").close()
    dropped = 0
    for chunk in _row_chunks(graph, types, per_chunk):
        drop = _is_held(chunk, graph.num_nodes, symmetric, held_keys)
        spill.spill_append(path, chunk.src[~drop])
        at = np.flatnonzero(drop)
        # the entries dropped before each row's end: its end moves down by them and by those of earlier chunks
        graph.indptr[chunk.row + 1:chunk.end + 1] -= dropped + np.searchsorted(at, chunk.ends - chunk.start)
        dropped += at.shape[0]
    total = int(graph.indptr[-1])
    return np.memmap(path, dtype=ids, mode="r", shape=(total,)) if total else np.empty(0, ids)


def _is_held(chunk: _Chunk, n: int, symmetric: bool, held_keys: np.ndarray) -> np.ndarray:
    """Whether each entry of ``chunk`` leaves with a held-out pair (``_leaves``). Only the target and reverse types'
    entries are looked up: an entry of any other type never leaves, and the lookups are the split's cost (3.3 of
    5.5 s at 1 M nodes of synthetic-hetero, 7 edge types, when every entry was looked up)."""
    if not held_keys.shape[0]:
        return np.zeros(chunk.src.shape[0], dtype=bool)
    if chunk.target is None:   # every entry is of the target type (R = 1): nothing to pick
        return _leaves(chunk.src, chunk.dst, None, n, symmetric, held_keys)
    pos = np.flatnonzero(chunk.target if chunk.reverse is None else chunk.target | chunk.reverse)
    reverse = None if chunk.reverse is None else chunk.reverse[pos]
    held = np.zeros(chunk.src.shape[0], dtype=bool)
    held[pos[_leaves(chunk.src[pos], chunk.dst[pos], reverse, n, symmetric, held_keys)]] = True
    return held


def _leaves(src: np.ndarray, dst: np.ndarray, reverse: np.ndarray | None, n: int, symmetric: bool,
            held_keys: np.ndarray) -> np.ndarray:
    """Whether each target-type or (where ``reverse``) reverse-type entry ``src -> dst`` leaves. A target-type
    entry's key is ``src * n + dst``, ``min * n + max`` when symmetric (held pairs are ``u < v``: ``split_edges``'s
    two ``isin``, on ``src * n + dst`` and ``dst * n + src``, in one); a reverse-type entry's is ``dst * n + src``,
    its forward pair's (``split_edges``'s ``rev_dst * n + rev_src``). It leaves when its key is a held key."""
    lo, hi = (np.minimum(src, dst), np.maximum(src, dst)) if symmetric else (src, dst)
    if reverse is not None and reverse.any():   # one at a time: one array of 4 B an entry more, not two
        lo = np.where(reverse, dst, lo)
        hi = np.where(reverse, src, hi)
    keys = lo.astype(np.int64)
    keys *= n
    keys += hi
    del lo, hi
    at = np.searchsorted(held_keys, keys)
    np.minimum(at, held_keys.shape[0] - 1, out=at)
    return held_keys[at] == keys
