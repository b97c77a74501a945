"""The download stage under ``memory_budget_bytes`` (``stages.memory``): which path builds the canonical graph.

``choose`` estimates the in-memory path's peak anonymous memory. When it fits the budget, the in-memory path runs
(products-scale speed unchanged); otherwise a ``files`` dataset (homogeneous without ``edge_attr.npy``, or typed),
a ``synthetic`` / ``synthetic-link`` graph (no edge features) or ``synthetic-hetero`` takes the streaming path:
the CSR from ``external_sort`` in the budget left after the O(N) arrays (a typed graph's one row per node and edge
type), ``x`` (per node type) and ``indices`` as memory maps written chunk by chunk; with task=link, then the
held-out edge split of ``link_edge_type`` (a typed graph's) from that memory-mapped CSR (``edge_split_stream``):
the same bytes. Every other source (OGB and ogbl-*, edge features) does not stream yet: beyond the budget it fails
in one line naming its estimate. OGB's size is unknown before its download: it always runs in memory.

The estimates (bytes) and the numbers that decide them:

- in-memory ``files``: ``16 E`` when symmetrising (two int64 keys per listed edge, sorted in place and reused as
  ``indices``; ``8 E`` directed) + ``E`` (self-loop mask) + ``8 E`` for a CSR input (its destinations, repeated)
  + ``NODE_BYTES`` per node + the write buffers; edge features add ``64 E + 12 E D`` (the stable argsort's index
  and keys, the float32 copies);
- task=link adds ``SPLIT_ENTRY_BYTES`` per CSR entry (``edge_split.split_edges``; a ``files`` dataset's entries
  taken as 2 per listed edge when symmetrised, an upper bound); a typed graph's, 48 B per listed edge (typed
  ``files``) or 96 B (``synthetic-hetero``): at 1 M nodes, 7 edge types, the stage peaked 851-942 MiB and
  1.07 GiB against 1.53 and 2.27 GB estimated (benchmarks/RESULTS.md);
- in-memory ``synthetic``: ``33`` bytes per urn entry (~``avg_degree / 2`` per node: the int32 urn, the drawn
  ends, their relabelled copies, then two int64 keys and a mask), the float32 ``x`` (``4 F`` per node),
  ``SYNTH_NODE_BYTES`` per node, one draw block (``DRAW_BYTES`` per entry) and the write buffers: at 1 M nodes,
  avg_degree 20 and 64 features ~0.77 GB, so a 256 MiB budget streams it;
- in-memory typed (``files``, ``synthetic-hetero``; R edge types): ``16`` bytes per edge of every edge type (each
  type's ends copied to int64 orig ids, a reverse type's again) + ``18`` per sort key (the per-type keys and their
  concatenation, then the duplicate masks and the distinct copy; a symmetrised type's edges count twice) +
  ``ROW_BYTES`` per (node, edge type) row (indptr's searchsorted) + ``NODE_BYTES`` per node + the write buffers;
  ``synthetic-hetero`` adds its drawn edges (two int64 a listed edge) and the float32 paper features;
- streaming minimum: the O(N) arrays (``NODE_BYTES``, synthetic ``SYNTH_NODE_BYTES``, per node; a typed graph
  ``ROW_BYTES`` more per row beyond a node's first, ``synthetic-hetero`` at least ``HETERO_DRAW_NODE_BYTES`` while it
  draws), with task=link the split's held-out pairs (``HELD_PAIR_BYTES`` each: valid + test fractions of the
  pairs, ``avg_degree N / 2`` for synthetic, at most one per listed edge for ``files``, and for a typed graph per
  listed edge of ``link_edge_type``, a reverse type's being its forward type's), plus the largest of one
  sort bucket's floor, the write buffers, (synthetic) one draw block and (task=link) the split's floor of one row
  chunk. The split's permutation is not in it: it is shuffled on disk (``edge_split_stream``, pass 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.download.edge_split import link_edge_type_index
from stages.download.edge_split_stream import (
    HELD_PAIR_BYTES,
    MIN_SCAN_ENTRIES,
    SCAN_BYTES_PER_ENTRY,
    split_edges_streamed,
)
from stages.download.synthetic import EDGE_BLOCK, generate_synthetic
from stages.download.synthetic_hetero import (
    DRAW_BYTES_PER_EDGE,
    FEATURE_BYTES_PER_VALUE,
    MIN_DRAW_EDGES,
    expected_edges,
    generate_synthetic_hetero,
    type_counts,
)
from stages.download.typed import TypedSizes, typed_sizes
from stages.download.typed_files import is_typed_dir, load_typed_files, typed_file_sizes
from stages.external_sort import BUCKET_BYTES_PER_KEY, MIN_BUCKET_KEYS, EdgeStream, SortSpace
from stages.memory import MemoryBudget, gib
from storage.errors import InputError
from storage.graph import Graph, index_dtype
from storage.schema import EdgeType, GraphSchema
from storage.zarr_io import chunk_rows_for

if TYPE_CHECKING:
    from stages.download.stage import Params
    from stages.executor import Executor

# Zarr writes a chunk as the chunk (a view, or its cast copy), its encoded bytes and the crc32c-framed copy: 3.
WRITE_BUFFERS = 3
# per node, homogeneous files: y (int64, and its cast copy while read) 16, splits <= 8, the external sort's row
# counts 8 with their bincount temporary 8 and cumulative sum 8 (then indptr 8): 48
NODE_BYTES = 48
# per node, synthetic: NODE_BYTES + the generator's O(N) arrays (expected degrees, weights and caps as float64 24,
# emitted counts and urn offsets 16, community and relabelling int32 12, the split's permutation 8): 108, rounded up
SYNTH_NODE_BYTES = 112
URN_ENTRY_BYTES = 33
DRAW_BYTES = 18   # synthetic._draw_ends: per entry of a block
# per CSR entry, edge_split.split_edges in memory: 13.7 GiB measured at 120 M entries (122 B), 117 B at 3 M; its
# int64 entry/src/dst copies (24), the pairs and their stack (16), the splits and the permutation (12), the keys
# and np.isin's concatenation, argsort and sorted copy, twice when symmetric (~50), the kept copy (8)
SPLIT_ENTRY_BYTES = 124
# per (node, edge type) row: the sort's row counts, their bincount temporary and cumulative sum (then indptr and
# edges_per_type's diff): the row part of NODE_BYTES, which a typed graph pays R times
ROW_BYTES = 24
# per node, synthetic-hetero while it draws: home classes and weights 16, the drawer's order and cumsum 16 and
# their construction's temporaries 24, the emitted counts and their cumsum 16: 72, rounded up
HETERO_DRAW_NODE_BYTES = 80


@dataclass(frozen=True)
class PathChoice:
    streamed: bool
    estimate: int | None   # the in-memory path's peak (None: unknown before the download, OGB)
    minimum: int           # the streaming path's fixed minimum (0 where it cannot stream)


def choose(params: Params, budget: MemoryBudget) -> PathChoice:
    """The path for ``params`` under ``budget``; InputError (one line) when neither fits (module docstring)."""
    estimate, streamable, why = _estimate(params)
    if estimate is None or budget.fits(estimate):
        return PathChoice(False, estimate, 0)
    if not streamable:
        raise InputError(f"download: {why} is built in memory (it does not stream yet) and needs about "
                         f"{gib(estimate)}, more than memory_budget_bytes={budget.bytes} ({budget.describe()}); "
                         f"raise memory_budget_bytes to {estimate} or more")
    link = params.task == "link"
    minimum = _resident(params) + _held_pairs(params) * HELD_PAIR_BYTES + max(
        MIN_BUCKET_KEYS * BUCKET_BYTES_PER_KEY, _write_buffers(params), _draw_block(params),
        MIN_SCAN_ENTRIES * SCAN_BYTES_PER_ENTRY if link else 0)
    budget.require(minimum, "the streaming path's O(N) arrays (indptr, y, splits)"
                            + (", the held-out valid/test edges" if link else "") + ", one sort bucket and one "
                            "chunk write")
    return PathChoice(True, estimate, minimum)


def load_streamed(params: Params, budget: MemoryBudget, scratch: str, executor: Executor | None = None
                  ) -> tuple[Graph, dict[str, Any]]:
    """The graph through ``external_sort`` (its ``indices`` and ``x`` memory maps in ``scratch``; its buckets
    sorted on ``executor``, None: in this process) and the sort's figures for the summary."""
    sort = SortSpace(scratch, max(1, budget.bytes - _resident(params)), executor)
    typed = _typed_sizes(params)
    if params.task == "link":   # a wrong name fails before the sort, not hours later
        _link_type(params, typed)
    if typed is not None:
        graph = _load_typed(params, sort)
    elif params.dataset == "files":
        from stages.download.files_source import open_files

        ds = open_files(os.path.abspath(params.path or ""))
        csr = sort.csr([EdgeStream(ds.topology.chunks(sort.chunk_edges), symmetrise=not ds.directed)],
                       int(ds.y.shape[0]))
        graph = ds.graph(csr.indptr, csr.indices)
    else:
        graph = generate_synthetic(params.num_nodes, params.avg_degree, params.num_features, params.num_classes,
                                   params.seed, split=params.split, name=params.dataset, sort=sort)
    info = sort.info()
    if params.task != "link":
        return graph, info
    edge_type = link_edge_type_index(graph.schema.edge_types, params.link_edge_type)
    graph, split = split_edges_streamed(graph, edge_type, params.link_split, params.seed,
                                        budget_bytes=sort.budget_bytes, scratch=scratch)
    return graph, info | split


def _link_type(params: Params, typed: TypedSizes | None) -> EdgeType:
    """The edge type ``link_edge_type`` names, from the sizes read before the graph (InputError, one line, when it
    names none)."""
    edge_types = list(typed.edges_per_type) if typed is not None else GraphSchema.homogeneous(1, 1, 2).edge_types
    return edge_types[link_edge_type_index(edge_types, params.link_edge_type)]


def _load_typed(params: Params, sort: SortSpace) -> Graph:
    """A typed graph through ``external_sort`` (``typed.build_graph``'s streaming path)."""
    if params.dataset == "synthetic-hetero":
        return generate_synthetic_hetero(params.num_nodes, params.avg_degree, params.num_features,
                                         params.num_classes, params.seed, split=params.split,
                                         add_reverse=params.add_reverse, sort=sort)
    return load_typed_files(os.path.abspath(params.path or ""), add_reverse=params.add_reverse, sort=sort)


def _estimate(params: Params) -> tuple[int | None, bool, str]:
    """(in-memory peak estimate, whether the streaming path can build it, what it is in words)."""
    link = params.task == "link"
    typed = _typed_sizes(params)
    if typed is not None:
        return _typed_estimate(params, typed)
    if params.dataset in ("synthetic", "synthetic-link"):
        n = params.num_nodes
        entries = int(params.avg_degree * n / 2)
        edge_features = 12 * 2 * entries * params.num_edge_features + 128 * entries if params.num_edge_features else 0
        estimate = (URN_ENTRY_BYTES * entries + 4 * params.num_features * n + SYNTH_NODE_BYTES * n
                    + _draw_block(params) + _write_buffers(params) + edge_features
                    + (SPLIT_ENTRY_BYTES * 2 * entries if link else 0))
        streamable = params.dataset in ("synthetic", "synthetic-link") and not params.num_edge_features
        why = (f"dataset {params.dataset}" + (" with edge features" if params.num_edge_features else "")
               + (" with task=link" if link else ""))
        return estimate, streamable, why
    if params.dataset != "files":
        return None, False, f"dataset {params.dataset}"
    shapes = _file_shapes(os.path.abspath(params.path or ""))
    if shapes is None:   # a typed layout or a broken file: the in-memory path checks and reports it
        return None, False, "a typed files dataset"
    n, e, csr, d, directed = shapes
    keys = 8 * e * (1 if directed else 2)
    estimate = (keys + e + (8 * e if csr else 0) + NODE_BYTES * n + _write_buffers(params, n, 2 * e)
                + (64 * e + 12 * e * d if d else 0) + (SPLIT_ENTRY_BYTES * keys // 8 if link else 0))
    why = f"files dataset {params.path}" + (" with edge_attr.npy" if d else "") + (" with task=link" if link else "")
    return estimate, not d, why


def _file_shapes(path: str) -> tuple[int, int, bool, int, bool] | None:
    """(N, listed edges, CSR input, edge feature columns, directed) from the .npy headers (memory maps: no read),
    None where a file is missing or unreadable (the loader names the problem)."""
    from stages.download.files_source import _load, _read_meta
    from stages.download.typed_files import is_typed_dir

    try:
        if is_typed_dir(path):
            return None
        meta = _read_meta(path)
        x = _load(path, "x.npy", mmap=True)
        csr = not os.path.exists(os.path.join(path, "edge_index.npy"))
        e = _load(path, "indices.npy" if csr else "edge_index.npy", mmap=True).shape[-1]
        attr = os.path.join(path, "edge_attr.npy")
        d = 0 if not os.path.exists(attr) else int(np.prod(_load(path, "edge_attr.npy", mmap=True).shape[1:]) or 1)
        return int(x.shape[0]), int(e), csr, d, bool(meta.get("directed", False))
    except (InputError, IndexError):
        return None


def _typed_sizes(params: Params) -> TypedSizes | None:
    """A typed dataset's sizes (``typed.typed_sizes``); None for a homogeneous one, or a typed directory whose files
    are missing or broken (the in-memory path reports the problem)."""
    if params.dataset == "synthetic-hetero":
        counts = type_counts(params.num_nodes, params.num_classes)
        return typed_sizes(counts, expected_edges(params.num_nodes, params.avg_degree, params.num_classes),
                           {"paper": 4 * params.num_features}, add_reverse=params.add_reverse)
    path = os.path.abspath(params.path or "")
    found = typed_file_sizes(path) if params.dataset == "files" and is_typed_dir(path) else None
    return None if found is None else typed_sizes(*found, add_reverse=params.add_reverse)


def _typed_estimate(params: Params, typed: TypedSizes) -> tuple[int, bool, str]:
    """``_estimate`` of a typed dataset (module docstring)."""
    link = params.task == "link"
    n, rows = typed.num_nodes, typed.num_nodes * typed.num_edge_types
    estimate = 16 * typed.edges + 18 * typed.keys + ROW_BYTES * rows + NODE_BYTES * n + _write_buffers(params)
    if params.dataset == "synthetic-hetero":
        estimate += 16 * typed.listed + typed.feature_bytes + (96 * typed.listed if link else 0)
        why = "dataset synthetic-hetero"
    else:
        estimate += 48 * typed.listed if link else 0
        why = f"typed files dataset {params.path}"
    return estimate, True, why + (" with task=link" if link else "")


def _resident(params: Params) -> int:
    """The streaming path's O(N) arrays."""
    typed = _typed_sizes(params)
    if typed is not None:
        resident = NODE_BYTES * typed.num_nodes + ROW_BYTES * typed.num_nodes * (typed.num_edge_types - 1)
        return max(resident, HETERO_DRAW_NODE_BYTES * typed.num_nodes) if params.dataset != "files" else resident
    n = _num_nodes(params)
    return (SYNTH_NODE_BYTES if params.dataset != "files" else NODE_BYTES) * n


def _held_pairs(params: Params) -> int:
    """task=link: about how many pairs the split holds out (module docstring); 0 otherwise."""
    if params.task != "link":
        return 0
    typed = _typed_sizes(params)
    if typed is not None:   # a symmetrised type's pairs u < v are at most its listed edges too
        pairs = typed.edges_per_type[_link_type(params, typed)]
    elif params.dataset == "files":
        shapes = _file_shapes(os.path.abspath(params.path or ""))
        pairs = 0 if shapes is None else shapes[1]
    else:
        pairs = int(params.avg_degree * params.num_nodes / 2)
    return int(pairs * (1.0 - params.link_split[0])) + 2   # + 2: each held-out split rounds up by at most one


def _num_nodes(params: Params) -> int:
    if params.dataset != "files":
        return params.num_nodes
    shapes = _file_shapes(os.path.abspath(params.path or ""))
    return 0 if shapes is None else shapes[0]


def _draw_block(params: Params) -> int:
    if params.dataset == "files":
        return 0
    if params.dataset == "synthetic-hetero":   # its draw and feature blocks are sized to the budget, down to these
        return max(DRAW_BYTES_PER_EDGE * MIN_DRAW_EDGES, FEATURE_BYTES_PER_VALUE * params.num_features)
    return DRAW_BYTES * min(EDGE_BLOCK, int(params.avg_degree * params.num_nodes / 2) + 1)


def _write_buffers(params: Params, n: int | None = None, edges: int | None = None) -> int:
    """WRITE_BUFFERS copies of the largest chunk written: ``indices`` (index dtype, ~``edges`` long) or ``x``."""
    typed = _typed_sizes(params)
    if typed is not None:   # the sort's keys bound its edges; x is written per node type
        return _chunk_writes(typed.num_nodes, typed.keys, typed.x_chunk_bytes)
    n = _num_nodes(params) if n is None else n
    edges = int(params.avg_degree * n) if edges is None else edges
    features = params.num_features * 4
    if params.dataset == "files":
        shapes = _file_shapes(os.path.abspath(params.path or ""))
        path = os.path.abspath(params.path or "")
        if shapes is not None:
            from stages.download.files_source import _load

            x = _load(path, "x.npy", mmap=True)
            features = x.dtype.itemsize * int(np.prod(x.shape[1:]))
    return _chunk_writes(n, edges, chunk_rows_for(max(n, 1), features) * features)


def _chunk_writes(n: int, edges: int, x_chunk_bytes: int) -> int:
    """WRITE_BUFFERS copies of the larger of an ``indices`` chunk and an ``x`` chunk."""
    ids = index_dtype(n).itemsize
    return WRITE_BUFFERS * max(chunk_rows_for(max(edges, 1), ids) * ids, x_chunk_bytes)
