"""The adjacency METIS partitions: symmetric, without self-loops, and sparsified when the graph is big.

Why sparsify: pymetis 2025.2.2 is built with 64-bit ``idx_t`` and METIS keeps several coarsened copies of the graph
(plus the unit edge weights it allocates itself), so METIS on a 2.4 M-node / 120 M-entry graph peaked at 14 GB RSS.
Each undirected edge {u, v} is kept with probability ``min(1, k / min(deg u, deg v))`` (every node keeps about k of
its edges, hub-hub edges mostly go) and weighted by ~``1 / probability``, so the weighted cut estimates the real
one; the balance repair and refinement that follow work on the whole adjacency.

Measured on ``generate_synthetic(2_400_000, 50, ...)`` with 2 parts (benchmarks/RESULTS.md, [1/5] "METIS input
budget"): below ~5 kept entries per node METIS falls apart (2^23 entries, 3.5 per node: cut 0.235), above 2^24 it
only costs memory and time (2^24, 7 per node: cut 0.126-0.135, peak 3.2 GB; 2^26: cut 0.126, peak 9.3 GB). Hence
the budget ``max(2^24, 7 * N)``.

A directed or typed graph has no stored symmetric adjacency. In memory ``_symmetrise`` builds it with one
``np.unique`` over both directions' int64 keys (64 B a graph entry at its peak); the stage's streamed path calls
``external_symmetric`` instead, the external bucket sort (``stages.external_sort``) over the CSR's (src, dst) pairs
within a byte budget: the same values (each row's neighbours sorted, no duplicates or self-loops), ``adjncy`` a
memory map in the scratch dir, so METIS and KaMinPar get the same input and give the same partition.
"""
from __future__ import annotations

import tempfile

import numpy as np

from stages.external_sort import SLICE_BYTES_PER_EDGE, ExternalCsr, csr_chunks, distinct_sorted, external_csr
from stages.partition.csr_ops import chunk_rows, degrees, row_chunks

# METIS gets at most max(METIS_EDGE_BUDGET, METIS_ENTRIES_PER_NODE * N) CSR entries (see the module docstring).
METIS_EDGE_BUDGET = 1 << 24
METIS_ENTRIES_PER_NODE = 7


def default_budget(num_nodes: int) -> int:
    return max(METIS_EDGE_BUDGET, METIS_ENTRIES_PER_NODE * num_nodes)


def _pair_hash(rows: np.ndarray, cols: np.ndarray, num_nodes: int, seed: int) -> np.ndarray:
    """53 well-mixed bits (uint64) per undirected pair, equal for (u, v) and (v, u), so sampling keeps symmetry.

    A multiply-xorshift mix (half of splitmix64) done in place: this runs on every CSR entry, and at 120 M entries
    each extra pass costs ~0.3 s.
    """
    key = np.minimum(rows, cols).astype(np.uint64)
    key *= np.uint64(num_nodes)
    key += np.maximum(rows, cols).astype(np.uint64)
    key += np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64)
    key *= np.uint64(0xBF58476D1CE4E5B9)
    key ^= key >> np.uint64(31)
    key *= np.uint64(0x94D049BB133111EB)
    key >>= np.uint64(11)
    return key


def symmetric_adjacency(indptr: np.ndarray, indices: np.ndarray, *, directed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj, adjncy)``: the symmetric adjacency without self-loops or duplicates (``xadj`` int64; ``adjncy`` int64,
    or ``indices``' own dtype when returned as it is).

    Undirected graphs are already stored symmetrised (``storage.graph``): their arrays are returned as they are
    (no copy, a memory map stays one) unless they hold self-loops. Directed graphs are symmetrised (u->v or v->u
    makes {u, v}).
    """
    num_nodes = int(indptr.shape[0] - 1)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    if directed:
        return _symmetrise(indptr, np.ascontiguousarray(indices, dtype=np.int64), num_nodes)
    # Necessary condition for symmetry, a bincount: each node is a source as often as it is a target. In row
    # chunks, and ``indices`` kept as given (int32 or a memory map): a whole-array bincount or int64 cast would
    # copy 400 M entries (3.2 GB) into memory. METIS assumes symmetry without checking; an asymmetric input can
    # crash it or be mispartitioned silently.
    as_target = np.zeros(num_nodes, dtype=np.int64)
    for r0, r1 in row_chunks(indptr):
        as_target += np.bincount(indices[indptr[r0]:indptr[r1]], minlength=num_nodes)
    if not np.array_equal(as_target, degrees(indptr)):
        raise ValueError("the graph is marked undirected but its CSR is not symmetric; "
                         "mark it directed (or symmetrise it) in the download stage")
    num_loops = 0
    for r0, r1 in row_chunks(indptr):
        num_loops += int(np.count_nonzero(chunk_rows(indptr, r0, r1) == indices[indptr[r0]:indptr[r1]]))
    if num_loops == 0:
        return indptr, indices
    keep_parts, counts = [], np.zeros(num_nodes, dtype=np.int64)
    for r0, r1 in row_chunks(indptr):
        rows = chunk_rows(indptr, r0, r1)
        cols = indices[indptr[r0]:indptr[r1]]
        keep = rows != cols
        keep_parts.append(cols[keep])
        counts[r0:r1] = np.bincount(rows[keep] - r0, minlength=r1 - r0)
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=xadj[1:])
    return xadj, np.concatenate(keep_parts)


def _symmetrise(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    # Both directions of every edge as one int64 key row * N + col; a sort dedups them and orders the rows.
    # An in-place sort and a mask, not np.unique: NumPy 2.4's hash-based np.unique took 108 s and 1.5 GiB over the
    # start for the 20 M keys of a directed 1 M-node graph on this box, where the sort takes seconds.
    keys = []
    for r0, r1 in row_chunks(indptr):
        rows = chunk_rows(indptr, r0, r1)
        cols = indices[indptr[r0]:indptr[r1]]
        keep = rows != cols
        rows, cols = rows[keep], cols[keep]
        keys.append(rows * num_nodes + cols)
        keys.append(cols * num_nodes + rows)
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    del keys
    key.sort()
    key = distinct_sorted(key)
    rows = key // num_nodes
    adjncy = np.remainder(key, num_nodes, out=key)   # the columns, in place of their keys
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_nodes), out=xadj[1:])
    return xadj, adjncy


def external_symmetric(indptr: np.ndarray, indices: np.ndarray, *, budget_bytes: int, scratch: str) -> ExternalCsr:
    """``_symmetrise``'s ``(xadj, adjncy)`` by the external sort, within ``budget_bytes`` of temporaries and
    ``external_sort.NODE_BYTES`` a node: ``indptr`` int64, ``indices`` a read-only memory map in a directory of
    its own under ``scratch`` (removed with it), int32 below 2^31 nodes (the values ``_symmetrise`` gives as
    int64; the consumers read either, as they read a stored int32 ``indices`` on the streamed path)."""
    # the edges in chunks of one pass-2 slice, as the download stage feeds it: a chunk's int64 destinations (8 B an
    # edge) fit the slack in the slice's 64 B an edge
    chunks = csr_chunks(indptr, indices, max(1, budget_bytes // SLICE_BYTES_PER_EDGE))
    return external_csr(chunks, int(indptr.shape[0] - 1), symmetrise=True, budget_bytes=budget_bytes,
                        scratch=tempfile.mkdtemp(prefix="symmetric-", dir=scratch), stage="partition")


def _keep_scale(xadj: np.ndarray, adjncy: np.ndarray, budget: int, seed: int) -> float:
    """The k for which the expected number of kept entries is about ``budget`` (bisection on a sample)."""
    num_entries = int(adjncy.shape[0])
    deg = degrees(xadj)
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, num_entries, size=min(num_entries, 1 << 20))
    rows = np.searchsorted(xadj, pos, side="right") - 1
    min_deg = np.minimum(deg[rows], deg[adjncy[pos]]).astype(np.float64)
    target = budget / num_entries
    lo, hi = 1e-3, float(min_deg.max())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.minimum(1.0, mid / min_deg).mean() > target:
            hi = mid
        else:
            lo = mid
    return lo


def sparsify(xadj: np.ndarray, adjncy: np.ndarray, *, budget: int | None = None,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(xadj, adjncy, eweights)`` with about ``budget`` entries; unchanged (weights None) if already small.

    Input and output are symmetric: the keep decision is a hash of the unordered pair.
    """
    num_nodes = int(xadj.shape[0] - 1)
    budget = default_budget(num_nodes) if budget is None else budget
    if adjncy.shape[0] <= budget:
        return xadj, adjncy, None
    k = _keep_scale(xadj, adjncy, budget, seed)
    deg = degrees(xadj)
    cols_parts, weight_parts = [], []
    counts = np.zeros(num_nodes, dtype=np.int64)
    for r0, r1 in row_chunks(xadj):
        cols = adjncy[xadj[r0]:xadj[r1]]
        min_deg = np.repeat(deg[r0:r1], deg[r0:r1])
        np.minimum(min_deg, deg[cols], out=min_deg)
        # keep with probability min(1, k / min_deg):  h / 2^53 < k / min_deg  <=>  h * min_deg < k * 2^53
        keep = _pair_hash(chunk_rows(xadj, r0, r1), cols, num_nodes, seed).astype(np.float64) * min_deg
        keep = keep < k * 2.0 ** 53
        cols_parts.append(cols[keep])
        weight_parts.append(np.maximum(1, np.rint(min_deg[keep] / k)).astype(np.int64))
        kept_before = np.zeros(keep.shape[0] + 1, dtype=np.int64)
        np.cumsum(keep, out=kept_before[1:])
        local = xadj[r0:r1 + 1] - xadj[r0]
        counts[r0:r1] = kept_before[local[1:]] - kept_before[local[:-1]]
    out_xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=out_xadj[1:])
    return out_xadj, np.concatenate(cols_parts), np.concatenate(weight_parts)
