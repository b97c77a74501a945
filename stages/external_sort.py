"""The canonical incoming CSR of a graph larger than memory: an external bucket sort over spill files.

Shared by two stages: download builds the canonical graph with it, and the partition stage's streamed path the
symmetric adjacency of a directed or typed graph (``stages.partition.adjacency``: the CSR's own (src, dst) pairs,
symmetrised, give exactly what its in-memory ``_symmetrise`` gives).

Builds exactly what ``canonical.typed_csr_incoming`` builds (self-loops and duplicates dropped, a symmetrised edge
type's reversed edges added, each row's sources sorted), from edges that arrive in chunks ((src, dst) pairs of any
integer dtype, e.g. slices of a memory-mapped ``edge_index.npy``), with anonymous memory bounded by a byte budget.
A homogeneous graph is one ``EdgeStream``; a typed graph is one per edge type (R of them, in schema order), each
in its node types' own ids with the offsets that make them the graph's orig ids. Rows are (node, edge type):
``row = v * R + e``, N * R of them (R = 1: the destination node):

1. count pass: one pass over the chunks counts the keys each row receives (an upper bound: before duplicates go),
   O(N * R) memory;
2. the rows are cut into buckets of consecutive rows whose keys (int64 ``row * N + src``, as in ``canonical``)
   fit the bucket share of the budget; a second pass appends each chunk's keys to its buckets' spill files;
3. per bucket: read its keys, sort in place, drop duplicates, append the sources (``index_dtype``) to the output
   spill file and the row counts to ``indptr``. Given an ``executor`` (``stages.executor``, the download stage's
   streamed path), each bucket is a unit (``stages.sort_units``) that writes its sources and counts to files of
   its own beside its keys; this process then fills ``indptr`` and appends the pieces in bucket order: the same
   bytes. ``slots`` buckets are sorted at once, so each gets ``budget_bytes / slots``.

Keys stay below N * R * N, so int64 holds them while N <= 3.04e9 / sqrt(R) (``canonical.check_num_nodes``: 1.15e9
nodes with MAG's R = 7). A bucket costs ``BUCKET_BYTES_PER_KEY`` bytes per key: the int64 keys, the duplicate mask,
the deduplicated copy and the narrowed sources. The output ``indices`` is a memory map of a file in the scratch
directory (page cache, not anonymous memory), ``indptr`` int64 [N*R+1] the only O(N * R) array returned.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from stages.download.canonical import check_num_nodes, edge_keys
from storage import spill
from storage.errors import InputError
from storage.graph import index_dtype

if TYPE_CHECKING:
    from stages.executor import Executor

EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
"""Calling it starts a pass over the edges (called twice: count, then bucket)."""

# per key of a bucket: 8 (int64 key) + 1 (duplicate mask) + 8 (deduplicated copy) + 4-8 (sources) ≈ 25; 32 leaves
# room for the row-count bincount of a small bucket
BUCKET_BYTES_PER_KEY = 32
# per listed edge of a pass-2 slice: 2 int64 keys (symmetrised) 16 + the self-loop mask, the slice's int64 casts 16
# (offset into the graph's ids), the typed row ``dst * R + e`` 8 and the bucket split of the sorted keys 8: 49,
# rounded up
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

    indptr: np.ndarray     # int64 [N*R+1]
    indices: np.ndarray    # index_dtype [E], memory-mapped
    buckets: int
    spill_bytes: int       # bytes written to spill files (bucket keys and the output indices)
    units: int = 0         # buckets sorted as units on an executor (0: in this process)


@dataclass
class SortSpace:
    """Where external sorts spill (``scratch``), the anonymous memory they may use (``budget_bytes``) and where
    their buckets are sorted (``executor``: None, this process); adds up what its sorts and the sources' own
    spills wrote, for the stage's summary."""

    scratch: str
    budget_bytes: int
    executor: Executor | None = None
    buckets: int = 0
    spill_bytes: int = 0
    units: int = 0

    @property
    def chunk_edges(self) -> int:
        """Edges per chunk a source yields: one pass-2 slice's worth of the budget."""
        return max(1, self.budget_bytes // SLICE_BYTES_PER_EDGE)

    def csr(self, streams: Sequence[EdgeStream], num_nodes: int, scratch: str | None = None) -> ExternalCsr:
        """``external_typed_csr`` of ``streams`` in this space (spilling to ``scratch``, a folder of this space's
        own, if given)."""
        csr = external_typed_csr(streams, num_nodes, budget_bytes=self.budget_bytes,
                                 scratch=scratch or self.scratch, executor=self.executor)
        self.buckets += csr.buckets
        self.spill_bytes += csr.spill_bytes
        self.units += csr.units
        return csr

    def info(self) -> dict[str, int]:
        """The summary's figures (``sort_units`` only where buckets ran on an executor)."""
        return {"sort_buckets": self.buckets, "spill_bytes": self.spill_bytes,
                **({"sort_units": self.units} if self.units else {})}


@dataclass(frozen=True)
class EdgeStream:
    """One edge type's edges as ``chunks`` of (src, dst) ids, ``src_base`` / ``dst_base`` added to make them the
    graph's orig ids (a typed source's ids are its node types' own); ``symmetrise`` adds each reversed edge to the
    same edge type."""

    chunks: EdgeChunks
    symmetrise: bool = False
    src_base: int = 0
    dst_base: int = 0


def external_csr(chunks: EdgeChunks, num_nodes: int, *, symmetrise: bool, budget_bytes: int,
                 scratch: str, stage: str = "download", executor: Executor | None = None) -> ExternalCsr:
    """The canonical incoming CSR of the edges ``chunks`` yields (one edge type: ``external_typed_csr``); ``stage``
    is named in the error line of an absurdly small budget."""
    return external_typed_csr([EdgeStream(chunks, symmetrise)], num_nodes, budget_bytes=budget_bytes,
                              scratch=scratch, stage=stage, executor=executor)


def external_typed_csr(streams: Sequence[EdgeStream], num_nodes: int, *, budget_bytes: int,
                       scratch: str, stage: str = "download", executor: Executor | None = None) -> ExternalCsr:
    """The canonical incoming CSR, one row per (node, edge type), of ``streams`` (edge type e = ``streams[e]``;
    module docstring), within ``budget_bytes`` of anonymous memory on top of what the caller holds (and
    ``NODE_BYTES`` a row); spill files go to ``scratch`` (removed as they are used). ``executor``: pass 3's
    buckets run as its units, ``budget_bytes / executor.slots`` each (``scratch`` must be reachable from its
    workers); None: in this process, as before executors."""
    n = int(num_nodes)
    check_num_nodes(n, len(streams))
    counts = count_rows(streams, n)
    slots = 1 if executor is None else executor.slots
    bucket_keys = max(MIN_BUCKET_KEYS, budget_bytes // slots // BUCKET_BYTES_PER_KEY)
    starts = bucket_starts(counts, bucket_keys)
    if starts.shape[0] - 1 > MAX_BUCKETS:
        share = f" ({slots} sorted at once)" if slots > 1 else ""
        raise InputError(f"{stage}: a memory budget of {budget_bytes} bytes for sorting needs "
                         f"{starts.shape[0] - 1} spill buckets{share} (more than {MAX_BUCKETS}); raise "
                         f"memory_budget_bytes")
    del counts
    paths = [bucket_path(scratch, b) for b in range(starts.shape[0] - 1)]
    slice_edges = max(MIN_SLICE_EDGES, budget_bytes // SLICE_BYTES_PER_EDGE)
    spilled = _bucket_pass(streams, n, starts, paths, slice_edges)
    out_dtype = index_dtype(n)
    out_path = os.path.join(scratch, "indices.raw")
    indptr = np.zeros(n * len(streams) + 1, dtype=np.int64)
    with open(out_path, "wb"):
        pass   # the output exists even for a graph without edges
    if executor is not None:
        from stages.sort_units import sort_on

        total, written = sort_on(executor, paths, starts, n, indptr, out_path)
        spilled += written
    else:
        total = 0
        for b, path in enumerate(paths):
            bucket_counts, keys = sorted_bucket(path, int(starts[b]), int(starts[b + 1]), n, remove=True)
            indptr[int(starts[b]) + 1:int(starts[b + 1]) + 1] = bucket_counts
            del bucket_counts
            spill.spill_append(out_path, keys.astype(out_dtype, copy=False))
            total += keys.shape[0]
            spilled += keys.shape[0] * out_dtype.itemsize
            del keys
    np.cumsum(indptr, out=indptr)
    indices = (np.memmap(out_path, dtype=out_dtype, mode="r", shape=(total,)) if total
               else np.empty(0, dtype=out_dtype))
    return ExternalCsr(indptr, indices, len(paths), spilled, len(paths) if executor is not None else 0)


def bucket_path(scratch: str, b: int) -> str:
    """Bucket ``b``'s spill file of keys."""
    return os.path.join(scratch, f"bucket-{b:05d}.keys")


def sorted_bucket(path: str, lo: int, hi: int, n: int, *, remove: bool) -> tuple[np.ndarray, np.ndarray]:
    """Pass 3 of one bucket, rows [lo, hi), keys in ``path`` (missing: no keys): its rows' counts (int64
    [hi - lo]) and its sources (int64, in row order, each row's sorted, duplicates dropped). ``remove``: the
    spill file goes as soon as it is read (its disk space back before the next bucket's)."""
    keys = np.fromfile(path, dtype=np.int64) if os.path.exists(path) else np.empty(0, np.int64)
    if remove and os.path.exists(path):
        os.remove(path)
    keys.sort()
    keys = distinct_sorted(keys)
    rows = keys // n
    counts = np.bincount(rows - lo, minlength=hi - lo)
    del rows
    np.remainder(keys, n, out=keys)
    return counts, keys


def count_rows(streams: Sequence[EdgeStream], n: int) -> np.ndarray:
    """int64 [N * R]: keys per row ``v * R + e`` (listed edges and, for a symmetrised type, reversed ones;
    self-loops not)."""
    r = len(streams)
    counts = np.zeros(n * r, dtype=np.int64)
    for e, stream in enumerate(streams):
        for src, dst in stream.chunks():
            src, dst = _global(src, stream.src_base), _global(dst, stream.dst_base)
            keep = src != dst
            for ends in (dst, src)[:2 if stream.symmetrise else 1]:
                rows = ends[keep].astype(np.int64) * r + e if r > 1 else ends[keep]
                counts += np.bincount(rows, minlength=n * r)
                del rows
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


def _bucket_pass(streams: Sequence[EdgeStream], n: int, starts: np.ndarray, paths: list[str],
                 slice_edges: int) -> int:
    """Append every key to its bucket's spill file; returns the bytes written."""
    bounds = starts * n    # bucket b holds the keys in [bounds[b], bounds[b + 1])
    written = 0
    for e, stream in enumerate(streams):
        for src_chunk, dst_chunk in stream.chunks():
            for lo in range(0, src_chunk.shape[0], slice_edges):
                src = _global(src_chunk[lo:lo + slice_edges], stream.src_base)
                dst = _global(dst_chunk[lo:lo + slice_edges], stream.dst_base)
                keys = edge_keys(src, dst, n, symmetrise=stream.symmetrise, num_types=len(streams), edge_type=e)
                keys.sort()   # sorted keys are grouped by bucket: one contiguous write per bucket
                cuts = np.searchsorted(keys, bounds)
                for b in np.flatnonzero(np.diff(cuts)):
                    part = keys[cuts[b]:cuts[b + 1]]
                    spill.spill_append(paths[b], part)
                    written += part.nbytes
    return written


def _global(ids: np.ndarray, base: int) -> np.ndarray:
    """``ids + base`` in int64 (one allocation), or ``ids`` as they are without an offset; uint64 is cast to int64:
    uint64 with int64 promotes to float64 in NumPy and would round."""
    ids = np.asarray(ids)
    if base:
        return np.add(ids, base, dtype=np.int64, casting="unsafe")
    return ids.astype(np.int64) if ids.dtype == np.uint64 else ids


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
