"""Vectorised CSR helpers. Everything works on row chunks so per-edge temporaries stay bounded on big graphs
(a full ``np.repeat`` of row ids for 120 M edges alone would be ~1 GB)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

# ~16 M CSR entries per chunk: a few int64 temporaries of 128 MB each, big enough to amortise the Python loop.
CHUNK_EDGES = 1 << 24


def row_chunks(indptr: np.ndarray, max_edges: int = CHUNK_EDGES) -> Iterator[tuple[int, int]]:
    """Row ranges ``[r0, r1)`` covering all rows, each holding about ``max_edges`` entries (a longer row is alone)."""
    num_rows = int(indptr.shape[0] - 1)
    r0 = 0
    while r0 < num_rows:
        r1 = int(np.searchsorted(indptr, indptr[r0] + max_edges, side="right")) - 1
        r1 = min(max(r1, r0 + 1), num_rows)
        yield r0, r1
        r0 = r1


def chunk_rows(indptr: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Row id of every CSR entry of rows ``[r0, r1)`` (int64, absolute row ids)."""
    return np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0:r1 + 1]))


def gather_positions(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment gather: ``(sub_indptr, pos)`` such that ``indices[pos[sub_indptr[i]:sub_indptr[i+1]]]`` is row
    ``rows[i]``; rows may come in any order (this is how a relabelled CSR is built without a Python loop)."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = indptr[rows]
    deg = indptr[rows + 1] - starts
    sub_indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(deg, out=sub_indptr[1:])
    # entry j of output row i sits at starts[i] + (j - sub_indptr[i]): one repeat + one arange.
    pos = np.repeat(starts - sub_indptr[:-1], deg)
    pos += np.arange(sub_indptr[-1], dtype=np.int64)
    return sub_indptr, pos


def gather_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sub-CSR ``(sub_indptr, sub_indices)`` of ``rows`` in the given order."""
    sub_indptr, pos = gather_positions(indptr, rows)
    return sub_indptr, indices[pos]


def degrees(indptr: np.ndarray) -> np.ndarray:
    return np.diff(indptr).astype(np.int64, copy=False)
