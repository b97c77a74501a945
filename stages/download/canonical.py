"""Edge lists → the canonical CSR of incoming edges (see ``storage.graph``), and the features' finiteness.

Every source (synthetic, OGB, files) goes through :func:`to_csr_incoming` and :func:`check_finite`, so the
invariants of ``graph.zarr`` (symmetrised if undirected, no self-loops, no duplicates, rows sorted by source; every
feature finite) are established in one place.

Memory matters more than elegance here: at ogbn-products scale the symmetrised edge list has ~124 M entries, so
every temporary of that length costs ~1 GB. Each (dst, src) pair is encoded as one int64 key ``dst * N + src``:
sorting the keys once orders edges by destination row and, within a row, by source, which is exactly CSR order;
duplicates become adjacent equal keys. NumPy's in-place sort is used rather than ``torch.sort``: on the benchmark
machine of ``benchmarks/RESULTS.md`` (2 vCPUs with AVX-512, which NumPy's sort uses) it measured faster (11.5 s vs
16 s for 120 M random keys, the edge count of the products-scale graph there) and needs no second buffer for
values and permutation indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from storage.errors import InputError

# Cap on int64 keys: dst * N + src must not overflow, i.e. N**2 < 2**63 (N up to ~3 * 10**9 nodes).
_MAX_NODES = 3_037_000_499
# The finite check reads x in blocks of ~16 MiB, so its boolean temporary stays at 4 MiB for a float32 x that may be
# a memory map larger than RAM; at this size the whole products-scale x (2.4 M x 100 float32, 0.98 GB) is checked in
# 0.06 s (benchmarks/bench_feature_checks.py, figures in benchmarks/RESULTS.md).
FINITE_CHECK_BYTES = 16 << 20


def to_csr_incoming(src: np.ndarray, dst: np.ndarray, num_nodes: int, *,
                    directed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(indptr int64 [N+1], indices int64 [E])`` with ``indices[indptr[v]:indptr[v+1]]`` the sorted,
    distinct sources u != v of edges u -> v: the one-edge-type case of :func:`typed_csr_incoming`.

    ``directed=False`` adds every reversed edge first. ``src``/``dst`` may be any integer dtype; they are not
    modified.
    """
    return typed_csr_incoming([Relation(src, dst, symmetrise=not directed)], num_nodes)


def csr_with_edge_attr(src: np.ndarray, dst: np.ndarray, num_nodes: int, edge_attr: np.ndarray, *,
                       directed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`to_csr_incoming` carrying per-edge attributes: ``(indptr, indices, edge_attr [E', D])`` with
    ``edge_attr[i]`` the attributes of the edge ``indices[i] -> its row``.

    ``edge_attr`` [E, D] is aligned with ``src``/``dst``. A reversed edge (``directed=False``) gets its edge's
    attributes; a self-loop's are dropped with it; of duplicates the first one listed wins, and a pair listed in
    both directions keeps each listed direction's own attributes (the listed edges sort before the reversed ones,
    and the sort is stable). Costs a stable argsort (a second E-long int64 buffer), which the attribute-free path
    avoids by sorting the keys in place: only graphs with edge features pay it.
    """
    src, dst = _check_edges(src, dst, num_nodes)
    if edge_attr.ndim != 2 or edge_attr.shape[0] != src.shape[0]:
        raise ValueError(f"edge_attr of shape {edge_attr.shape} for {src.shape[0]} edges; it must be [E, D]")
    if not 0 <= num_nodes <= _MAX_NODES:
        raise InputError(f"num_nodes={num_nodes} is out of range; a graph needs 0 <= num_nodes <= {_MAX_NODES}")
    keep_pos = np.flatnonzero(src != dst)   # listed edge positions without self-loops
    keys = edge_keys(src[keep_pos], dst[keep_pos], num_nodes, symmetrise=not directed)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    first = np.ones(keys.shape[0], dtype=bool)
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    keys, order = keys[first], order[first]
    indptr = np.searchsorted(keys, np.arange(num_nodes + 1, dtype=np.int64) * num_nodes).astype(np.int64)
    # a key's position modulo the kept edge count is its listed edge (reversed copies follow the listed ones)
    listed_pos = keep_pos[order % max(keep_pos.shape[0], 1)] if keep_pos.shape[0] else keep_pos
    return indptr, np.remainder(keys, num_nodes), np.ascontiguousarray(edge_attr[listed_pos])


@dataclass(frozen=True)
class Relation:
    """One edge type's edges in the graph's (type-offset) orig ids; ``symmetrise`` adds each reversed edge to it."""

    src: np.ndarray
    dst: np.ndarray
    symmetrise: bool = False
    name: str = ""   # for error messages: the edge type's key


def typed_csr_incoming(relations: Sequence[Relation], num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The incoming CSR of a graph with R = ``len(relations)`` edge types: ``(indptr int64 [N*R + 1], indices int64
    [E])``, row ``v * R + e`` holding the sorted, distinct sources u != v of v's incoming type-e edges.

    One CSR whose rows are (node, edge type) is every edge type's CSR interleaved: a node's edges stay one range
    ``[indptr[v * R], indptr[(v + 1) * R])`` (what METIS and the degree counts read) and a type-e row is one
    lookup (what typed sampling reads); with R = 1 it is the plain CSR.
    """
    r = len(relations)
    check_num_nodes(num_nodes, r)
    parts = []
    for e, rel in enumerate(relations):
        src, dst = _check_edges(rel.src, rel.dst, num_nodes, rel.name)
        parts.append(edge_keys(src, dst, num_nodes, symmetrise=rel.symmetrise, num_types=r, edge_type=e))
    # one relation (every homogeneous graph): its key buffer is sorted in place, no second copy
    keys = parts[0] if r == 1 else np.concatenate(parts)
    del parts
    keys.sort()  # in place: CSR order (by dst, edge type, then src)
    keys = _drop_duplicates_sorted(keys)
    indptr = np.searchsorted(keys, np.arange(num_nodes * r + 1, dtype=np.int64) * num_nodes).astype(np.int64)
    # The key's low "digit" is the source; reuse the key buffer for it instead of allocating another E-long array.
    np.remainder(keys, num_nodes, out=keys)
    return indptr, keys


def check_num_nodes(num_nodes: int, num_types: int) -> None:
    """Refuse in one line a node count whose keys ``(v * R + e) * N + u`` (R = ``num_types``) could pass 2**63:
    N <= 3.04e9 / sqrt(R), e.g. 1.15e9 nodes with MAG's 7 edge types (the external sort's bound too)."""
    if num_types < 1:
        raise InputError("a graph needs at least one edge type")
    max_nodes = int(_MAX_NODES / math.sqrt(num_types))
    if not 0 <= num_nodes <= max_nodes:
        with_types = f" with {num_types} edge types" if num_types > 1 else ""
        raise InputError(f"num_nodes={num_nodes} is out of range; a graph needs 0 <= num_nodes <= {max_nodes}"
                         f"{with_types}")


def _check_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Shapes, integer dtypes and id range; returns 1-D views (no copies)."""
    of = f" of edge type {name}" if name else ""
    src, dst = np.asarray(src), np.asarray(dst)
    if src.ndim != 1 or dst.ndim != 1 or src.shape != dst.shape:
        raise InputError(f"edge sources {src.shape} and destinations {dst.shape}{of} must be 1-D arrays of one "
                         "length; pass edge_index as [2, E]")
    for what, a in (("source", src), ("destination", dst)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"edge {what} ids{of} have dtype {a.dtype}; node ids must be integers")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= num_nodes):
            raise InputError(f"edge {what} ids{of} span [{int(a.min())}, {int(a.max())}] but the graph has "
                             f"{num_nodes} nodes; ids must be in [0, {num_nodes - 1}]")
    # uint64 + int64 promotes to float64 in NumPy, which would silently round large keys; ids fit in int64.
    return (src.astype(np.int64) if src.dtype == np.uint64 else src,
            dst.astype(np.int64) if dst.dtype == np.uint64 else dst)


def edge_keys(src: np.ndarray, dst: np.ndarray, n: int, *, symmetrise: bool, num_types: int = 1,
               edge_type: int = 0) -> np.ndarray:
    """int64 keys ``(dst * num_types + edge_type) * n + src`` without self-loops (and with reversed edges if
    ``symmetrise``).

    Computed straight into one preallocated buffer so no E-long int64 temporaries pile up (one edge type).
    """
    keep = src != dst  # self-loops are dropped here, before they cost a slot in the sort
    e = int(np.count_nonzero(keep))
    if e != src.shape[0]:
        src, dst = src[keep], dst[keep]
    del keep
    keys = np.empty(2 * e if symmetrise else e, dtype=np.int64)
    for out, hi, lo in ((keys[:e], dst, src), (keys[e:], src, dst))[:2 if symmetrise else 1]:
        if num_types > 1:
            hi = hi.astype(np.int64) * num_types + edge_type
        _fill_keys(out, hi, lo, n)
    return keys


def _fill_keys(out: np.ndarray, hi: np.ndarray, lo: np.ndarray, n: int) -> None:
    """``out = hi * n + lo`` in int64, in place (hi/lo may be narrower ints)."""
    np.multiply(hi, n, out=out, dtype=np.int64, casting="unsafe")
    np.add(out, lo, out=out, casting="unsafe")


def _drop_duplicates_sorted(keys: np.ndarray) -> np.ndarray:
    """Distinct values of a sorted array (like ``np.unique`` but without its sort and extra copies)."""
    if keys.shape[0] < 2:
        return keys
    dup = keys[1:] == keys[:-1]
    if not dup.any():
        return keys
    keep = np.empty(keys.shape[0], dtype=bool)
    keep[0] = True
    np.logical_not(dup, out=keep[1:])
    del dup
    return keys[keep]


def first_non_finite(x: np.ndarray, *, block_rows: int | None = None) -> tuple[int, int] | None:
    """``(row, column)`` of the first NaN or ±Inf of ``x`` [N, F] in row-major order, or None if all are finite.

    Bool and integer arrays are finite by type (no read). ``x`` is read in blocks of ``block_rows`` rows (default
    ~``FINITE_CHECK_BYTES``): ``np.isfinite(block).all()`` per block, the position located only in the bad block.
    """
    if x.dtype.kind != "f" or x.size == 0:
        return None
    row_bytes = max(x.dtype.itemsize * int(np.prod(x.shape[1:], dtype=np.int64)), 1)
    rows = block_rows or max(1, FINITE_CHECK_BYTES // row_bytes)
    for lo in range(0, x.shape[0], rows):
        block = np.asarray(x[lo:lo + rows])
        finite = np.isfinite(block)
        if not finite.all():
            row, col = np.unravel_index(int(np.argmin(finite)), finite.shape)[:2]   # argmin: the first False
            return lo + int(row), int(col)
    return None


def check_finite(x: np.ndarray, subject: str) -> None:
    """Refuse features with NaN/±Inf in one line naming ``subject`` (e.g. ``x.npy in /data/g``), the first bad row
    (= node id) and column: a NaN feature trains to ``loss nan`` and a NaN model several stages later."""
    found = first_non_finite(x)
    if found is None:
        return
    row, col = found
    value = float(x[row, col])
    kind = "NaN" if np.isnan(value) else ("-Inf" if value < 0 else "Inf")
    raise InputError(f"{subject} has {kind} at row {row}, column {col} (the first non-finite value); features must "
                     "be finite: replace or impute them (e.g. numpy.nan_to_num) and save again")


def check_classes(y: np.ndarray, num_classes: int, subject: str) -> None:
    """Refuse a dataset whose labelled nodes (``y >= 0``) hold fewer than 2 classes, in one line naming
    ``subject``: a 1-class dataset trains to a constant prediction and scores 100 %, which looks like success."""
    labelled = y[y >= 0]
    if num_classes >= 2 and labelled.size and int(labelled.min()) != int(labelled.max()):
        return
    which = f" (every labelled node has label {int(labelled[0])})" if labelled.size else ""
    raise InputError(f"{subject} has 1 class{which}; node classification needs at least 2: label nodes of another "
                     "class")
