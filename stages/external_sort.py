"""The canonical incoming CSR of a graph larger than memory: an external bucket sort over spill files.

Shared by two stages: download builds the canonical graph with it, and the partition stage's streamed path the
symmetric adjacency of a directed or typed graph (``stages.partition.adjacency``: the CSR's own (src, dst) pairs,
symmetrised, give exactly what its in-memory ``_symmetrise`` gives).

Builds exactly what ``canonical.to_csr_incoming`` builds (symmetrised if undirected, self-loops and duplicates
dropped, each row's sources sorted), from edges that arrive in chunks ((src, dst) pairs of any integer dtype, e.g.
slices of a memory-mapped ``edge_index.npy``), with anonymous memory bounded by a byte budget:

1. count pass: one pass over the chunks counts the keys each destination row receives (an upper bound: before
   duplicates go), O(N) memory;
2. the rows are cut into buckets of consecutive rows whose keys (int64 ``dst * N + src``, as in ``canonical``) fit
   the bucket share of the budget; a second pass appends each chunk's keys to its buckets' spill files;
3. per bucket: read its keys, sort in place, drop duplicates, append the sources (``index_dtype``) to the output
   spill file and the row counts to ``indptr``.

A bucket costs ``BUCKET_BYTES_PER_KEY`` bytes per key: the int64 keys, the duplicate mask, the deduplicated copy
and the narrowed sources. The output ``indices`` is a memory map of a file in the scratch directory (page cache,
not anonymous memory), ``indptr`` int64 [N+1] the only O(N) array returned.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from storage import spill
from storage.errors import InputError
from storage.graph import index_dtype

EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
"""Calling it starts a pass over the edges (called twice: count, then bucket)."""

# per key of a bucket: 8 (int64 key) + 1 (duplicate mask) + 8 (deduplicated copy) + 4-8 (sources) ≈ 25; 32 leaves
# room for the row-count bincount of a small bucket
BUCKET_BYTES_PER_KEY = 32
# per listed edge of a pass-2 slice: 2 int64 keys (symmetrised) 16 + the self-loop mask, the slice's int64 casts 16
# and the bucket split of the sorted keys 8: 48, rounded up
SLICE_BYTES_PER_EDGE = 64
MIN_BUCKET_KEYS = 1 << 10    # 8 KiB of keys: a floor, so that a budget near the minimum still makes progress
MIN_SLICE_EDGES = 1 << 12    # the same floor for a pass-2 slice
# the temporaries whatever the budget (the floors above): a caller's minimum
MIN_BYTES = max(MIN_BUCKET_KEYS * BUCKET_BYTES_PER_KEY, MIN_SLICE_EDGES * SLICE_BYTES_PER_EDGE)
# O(N) besides the budget: the int64 row counts with one bincount temporary (count pass) or their cumulative sum
# (bucket_starts), never all three; then the returned indptr alone (8), which the caller keeps
NODE_BYTES = 16
MAX_BUCKETS = 100_000        # one spill file each, appended per slice: beyond this the budget is absurdly small


@dataclass
class ExternalCsr:
    """The CSR an external sort built: ``indices`` is a read-only memory map in the scratch directory."""

    indptr: np.ndarray     # int64 [N+1]
    indices: np.ndarray    # index_dtype [E], memory-mapped
    buckets: int
    spill_bytes: int       # bytes written to spill files (bucket keys and the output indices)


def external_csr(chunks: EdgeChunks, num_nodes: int, *, symmetrise: bool, budget_bytes: int,
                 scratch: str, stage: str = "download") -> ExternalCsr:
    """The canonical incoming CSR of the edges ``chunks`` yields (module docstring), within ``budget_bytes`` of
    anonymous memory on top of what the caller holds (and ``NODE_BYTES`` a node); spill files go to ``scratch``
    (removed as they are used), and ``stage`` is named in the error line of an absurdly small budget."""
    n = int(num_nodes)
    counts = count_rows(chunks, n, symmetrise=symmetrise)
    bucket_keys = max(MIN_BUCKET_KEYS, budget_bytes // BUCKET_BYTES_PER_KEY)
    starts = bucket_starts(counts, bucket_keys)
    if starts.shape[0] - 1 > MAX_BUCKETS:
        raise InputError(f"{stage}: a memory budget of {budget_bytes} bytes for sorting needs "
                         f"{starts.shape[0] - 1} spill buckets (more than {MAX_BUCKETS}); raise memory_budget_bytes")
    del counts
    paths = [os.path.join(scratch, f"bucket-{b:05d}.keys") for b in range(starts.shape[0] - 1)]
    slice_edges = max(MIN_SLICE_EDGES, budget_bytes // SLICE_BYTES_PER_EDGE)
    spilled = _bucket_pass(chunks, n, symmetrise, starts, paths, slice_edges)
    out_dtype = index_dtype(n)
    out_path = os.path.join(scratch, "indices.raw")
    indptr = np.zeros(n + 1, dtype=np.int64)
    with open(out_path, "wb"):
        pass   # the output exists even for a graph without edges
    total = 0
    for b, path in enumerate(paths):
        lo, hi = int(starts[b]), int(starts[b + 1])
        keys = np.fromfile(path, dtype=np.int64) if os.path.exists(path) else np.empty(0, np.int64)
        if os.path.exists(path):
            os.remove(path)   # its disk space goes back before the next bucket's
        keys.sort()
        keys = distinct_sorted(keys)
        rows = keys // n
        indptr[lo + 1:hi + 1] = np.bincount(rows - lo, minlength=hi - lo)
        del rows
        np.remainder(keys, n, out=keys)
        spill.spill_append(out_path, keys.astype(out_dtype, copy=False))
        total += keys.shape[0]
        spilled += keys.shape[0] * out_dtype.itemsize
        del keys
    np.cumsum(indptr, out=indptr)
    indices = (np.memmap(out_path, dtype=out_dtype, mode="r", shape=(total,)) if total
               else np.empty(0, dtype=out_dtype))
    return ExternalCsr(indptr, indices, len(paths), spilled)


def count_rows(chunks: EdgeChunks, n: int, *, symmetrise: bool) -> np.ndarray:
    """int64 [N]: keys per destination row (listed edges and, if ``symmetrise``, reversed ones; self-loops not)."""
    counts = np.zeros(n, dtype=np.int64)
    for src, dst in chunks():
        src, dst = _ids(src), _ids(dst)
        keep = src != dst
        counts += np.bincount(dst[keep], minlength=n)
        if symmetrise:
            counts += np.bincount(src[keep], minlength=n)
    return counts


def bucket_starts(counts: np.ndarray, bucket_keys: int) -> np.ndarray:
    """Row boundaries ``[0, ..., N]`` of buckets of consecutive rows holding at most ``bucket_keys`` keys each (a
    row with more keys is a bucket of its own: a row is never split)."""
    n = counts.shape[0]
    cum = np.cumsum(counts)
    starts = [0]
    while starts[-1] < n:
        before = int(cum[starts[-1] - 1]) if starts[-1] else 0
        # the first row whose cumulative count passes before + bucket_keys closes the bucket (at least one row)
        end = int(np.searchsorted(cum, before + bucket_keys, side="right"))
        starts.append(min(n, max(end, starts[-1] + 1)))
    return np.asarray(starts, dtype=np.int64)


def _bucket_pass(chunks: EdgeChunks, n: int, symmetrise: bool, starts: np.ndarray, paths: list[str],
                 slice_edges: int) -> int:
    """Append every key to its bucket's spill file; returns the bytes written."""
    bounds = starts * n    # bucket b holds the keys in [bounds[b], bounds[b + 1])
    written = 0
    for src_chunk, dst_chunk in chunks():
        for lo in range(0, src_chunk.shape[0], slice_edges):
            keys = edge_keys(src_chunk[lo:lo + slice_edges], dst_chunk[lo:lo + slice_edges], n, symmetrise)
            keys.sort()   # sorted keys are grouped by bucket: one contiguous write per bucket
            cuts = np.searchsorted(keys, bounds)
            for b in np.flatnonzero(np.diff(cuts)):
                part = keys[cuts[b]:cuts[b + 1]]
                spill.spill_append(paths[b], part)
                written += part.nbytes
    return written


def edge_keys(src: np.ndarray, dst: np.ndarray, n: int, symmetrise: bool) -> np.ndarray:
    """int64 keys ``dst * n + src`` of the non-loop edges (and the reversed ones if ``symmetrise``)."""
    src, dst = _ids(src), _ids(dst)
    keep = src != dst
    if not keep.all():
        src, dst = src[keep], dst[keep]
    e = src.shape[0]
    keys = np.empty(2 * e if symmetrise else e, dtype=np.int64)
    np.multiply(dst, n, out=keys[:e], dtype=np.int64, casting="unsafe")
    keys[:e] += src
    if symmetrise:
        np.multiply(src, n, out=keys[e:], dtype=np.int64, casting="unsafe")
        keys[e:] += dst
    return keys


def _ids(a: np.ndarray) -> np.ndarray:
    """``a`` as an array, uint64 cast to int64: uint64 with int64 promotes to float64 in NumPy and would round."""
    a = np.asarray(a)
    return a.astype(np.int64) if a.dtype == np.uint64 else a


def distinct_sorted(keys: np.ndarray) -> np.ndarray:
    """Sorted ``keys`` without repeats: ``keys`` itself when it has none, else one compressed copy (a 1-byte mask
    a key besides). ``np.unique`` does the same far slower since NumPy 2.3's hash table (``adjacency._symmetrise``
    measured it)."""
    if keys.shape[0] < 2:
        return keys
    first = np.empty(keys.shape[0], dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return keys if first.all() else keys[first]


def csr_chunks(indptr: np.ndarray, indices: np.ndarray, edges_per_chunk: int) -> EdgeChunks:
    """(src, dst) chunks of an incoming CSR (``indices`` may be a memory map), rows cut where a chunk holds about
    ``edges_per_chunk`` edges (a row is never split): the CSR ``indices.npy`` input and the synthetic top-up."""
    def passes() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for row, end in row_ranges(indptr, edges_per_chunk):
            lo, hi = int(indptr[row]), int(indptr[end])
            dst = np.repeat(np.arange(row, end, dtype=np.int64), np.diff(indptr[row:end + 1]))
            yield np.asarray(indices[lo:hi]), dst
    return passes


def row_ranges(indptr: np.ndarray, edges_per_chunk: int) -> Iterator[tuple[int, int]]:
    """``(row, end)``: consecutive row ranges of a CSR holding about ``edges_per_chunk`` entries each (a row is
    never split) and at most ``edges_per_chunk`` rows, so that a chunk's per-row temporaries are bounded too where
    most rows are empty."""
    n = indptr.shape[0] - 1
    row = 0
    while row < n:
        end = int(np.searchsorted(indptr, int(indptr[row]) + edges_per_chunk, side="right")) - 1
        end = min(n, row + max(1, edges_per_chunk), max(end, row + 1))
        yield row, end
        row = end


def array_chunks(src: np.ndarray, dst: np.ndarray, edges_per_chunk: int) -> EdgeChunks:
    """(src, dst) slices of two aligned id arrays (memory maps: only a slice is read at a time)."""
    def passes() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for lo in range(0, src.shape[0], edges_per_chunk):
            yield np.asarray(src[lo:lo + edges_per_chunk]), np.asarray(dst[lo:lo + edges_per_chunk])
    return passes
