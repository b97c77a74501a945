"""Typed sources → one ``Graph``: per-type ids, features, labels and splits become the graph's orig id space.

Every typed source (``synthetic-hetero``, ``ogbn-mag``, typed ``files``) hands its graph over per type, in each
type's own ids, as a :class:`TypedSource`; :func:`build_graph` numbers the nodes type after type (schema order),
adds the reverse relations on request and builds the one incoming CSR of ``storage.graph``. Homogeneous sources
build their ``Graph`` directly (``Graph.homogeneous``): the same layout with one type.

``add_reverse`` follows PyG's ``ToUndirected``: an edge type between two node types gets a reverse type
``(dst, rev_<rel>, src)``; one within a node type (``paper cites paper``) is symmetrised in place.

Beyond the memory budget (``stages.download.streamed``) a source hands its edges over as memory maps and
``build_graph`` gets a ``SortSpace``: each edge type then streams into ``external_sort`` in chunks, in its node
types' own ids with the type offsets as the stream's bases, instead of being copied whole into int64 orig ids; the
same checks, the same CSR bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from stages.download.canonical import Relation, check_classes, check_finite, typed_csr_incoming
from stages.external_sort import EdgeStream, SortSpace, array_chunks
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.schema import EdgeType, GraphSchema, NodeType
from storage.zarr_io import chunk_rows_for


@dataclass
class TypedSource:
    """A typed graph in per-type ids, as a source reads it (nothing offset yet)."""

    num_nodes: dict[str, int]
    edges: dict[EdgeType, tuple[np.ndarray, np.ndarray]]   # (src ids of e.src, dst ids of e.dst)
    features: dict[str, np.ndarray]                          # node type -> [N_t, F_t]
    labels: dict[str, tuple[np.ndarray, int]]               # node type -> (y [N_t], -1 unlabelled; num_classes)
    splits: dict[str, dict[str, np.ndarray]]                 # node type -> split name -> per-type ids
    name: str = ""
    source: str = ""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class TypedSizes:
    """What the memory estimates of ``stages.download.streamed`` need of a typed source before reading it."""

    num_nodes: int
    num_edge_types: int      # R, reverse types included
    listed: int              # edges the source lists
    edges: int               # over the graph's edge types: a reverse type's are its forward type's once more
    keys: int                # what the sort sees: a symmetrised type's edges twice
    feature_bytes: int       # x of every featured node type
    x_chunk_bytes: int       # the largest Zarr chunk of an x (write_graph's chunking)
    edges_per_type: Mapping[EdgeType, int]   # per edge type of the graph, in schema order: its listed edges


def typed_sizes(num_nodes: Mapping[str, int], listed: Mapping[EdgeType, int], row_bytes: Mapping[str, int], *,
                add_reverse: bool) -> TypedSizes:
    """The sizes of a source with ``num_nodes`` per node type, ``listed`` edges per edge type and feature rows of
    ``row_bytes`` per featured type, with the edge types ``build_graph`` makes of them."""
    per_type = {e: listed[e] if e in listed else listed[EdgeType(e.dst, e.rel.removeprefix("rev_"), e.src)]
                for e in sorted(_edge_types(listed, add_reverse))}
    keys = sum(count * (2 if add_reverse and e.src == e.dst else 1) for e, count in per_type.items())
    x_chunk = max((chunk_rows_for(max(num_nodes[t], 1), b) * b for t, b in row_bytes.items()), default=0)
    return TypedSizes(sum(num_nodes.values()), len(per_type), sum(listed.values()), sum(per_type.values()), keys,
                      sum(num_nodes[t] * b for t, b in row_bytes.items()), x_chunk, per_type)


def typed_schema(src: TypedSource, *, add_reverse: bool) -> GraphSchema:
    """The schema of ``src`` (reverse edge types added if ``add_reverse``)."""
    node_types = tuple(NodeType(name, int(n), int(src.features[name].shape[1]) if name in src.features else None,
                                int(src.labels[name][1]) if name in src.labels else 0)
                       for name, n in src.num_nodes.items())
    return GraphSchema(node_types, tuple(_edge_types(src.edges, add_reverse)))


def _edge_types(listed: Iterable[EdgeType], add_reverse: bool) -> set[EdgeType]:
    """The listed edge types and, with ``add_reverse``, the reverse of each between two node types."""
    edge_types = set(listed)
    if add_reverse:
        edge_types |= {e.reverse() for e in edge_types if e.src != e.dst}
    return edge_types


def build_graph(src: TypedSource, *, add_reverse: bool, sort: SortSpace | None = None) -> Graph:
    """The ``Graph`` of ``src``: checked (one line naming the type), offset, reversed on request, one CSR; with
    ``sort`` its CSR comes from the external sort (``indices`` a memory map in ``sort.scratch``)."""
    schema = typed_schema(src, add_reverse=add_reverse)
    offsets = schema.orig_offsets()
    base = {t.name: int(offsets[i]) for i, t in enumerate(schema.node_types)}
    for name, x in src.features.items():
        if x.ndim != 2 or x.shape[0] != src.num_nodes[name]:
            raise InputError(f"features of node type {name} have shape {x.shape}; expected [{src.num_nodes[name]}, F]")
        check_finite(x, f"the features (x) of node type {name}")
    if sort is None:
        relations = [_relation(src, base, e, add_reverse) for e in schema.edge_types]
        indptr, indices = typed_csr_incoming(relations, schema.num_nodes)
    else:
        csr = sort.csr([_stream(src, base, e, add_reverse, sort.chunk_edges) for e in schema.edge_types],
                       schema.num_nodes)
        indptr, indices = csr.indptr, csr.indices
    return Graph(schema, indptr, indices, dict(src.features), _global_labels(src, schema, base),
                 _global_splits(src, base), directed=not add_reverse, name=src.name, source=src.source,
                 extra=dict(src.extra))


def _relation(src: TypedSource, base: dict[str, int], e: EdgeType, add_reverse: bool) -> Relation:
    """Edge type e's edges in the graph's orig ids (int64 copies)."""
    s, d = _type_edges(src, e)
    return Relation(s.astype(np.int64) + base[e.src], d.astype(np.int64) + base[e.dst],
                    symmetrise=add_reverse and e.src == e.dst, name=e.key)


def _stream(src: TypedSource, base: dict[str, int], e: EdgeType, add_reverse: bool, chunk_edges: int) -> EdgeStream:
    """Edge type e's edges as chunks of its node types' own ids (memory maps stay unread) with their offsets."""
    s, d = _type_edges(src, e)
    return EdgeStream(array_chunks(s, d, chunk_edges), symmetrise=add_reverse and e.src == e.dst,
                      src_base=base[e.src], dst_base=base[e.dst])


def _type_edges(src: TypedSource, e: EdgeType) -> tuple[np.ndarray, np.ndarray]:
    """Edge type e's (source, target) ids within their node types, checked; a reverse type (made by add_reverse)
    is its forward type's edges swapped."""
    if e in src.edges:
        s, d = src.edges[e]
    else:   # a reverse made by add_reverse
        d, s = src.edges[EdgeType(e.dst, e.rel.removeprefix("rev_"), e.src)]
    s, d = np.asarray(s), np.asarray(d)
    for ids, node_type, what in ((s, e.src, "source"), (d, e.dst, "target")):
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"edge type {e.key}: {what} ids have dtype {ids.dtype}; node ids must be integers")
        n = src.num_nodes[node_type]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise InputError(f"edge type {e.key}: {what} ids span [{int(ids.min())}, {int(ids.max())}] but node type "
                             f"{node_type} has {n} nodes; ids must be in [0, {n - 1}]")
    return s, d


def _global_labels(src: TypedSource, schema: GraphSchema, base: dict[str, int]) -> np.ndarray:
    y = np.full(schema.num_nodes, -1, dtype=np.int64)
    for name, (labels, num_classes) in src.labels.items():
        labels = np.asarray(labels)
        if labels.shape != (src.num_nodes[name],):
            raise InputError(f"labels of node type {name} have shape {labels.shape}; expected "
                             f"[{src.num_nodes[name]}]")
        if labels.size and int(labels.max()) >= num_classes:
            raise InputError(f"labels of node type {name} reach {int(labels.max())} with {num_classes} classes; "
                             f"labels must be in [0, {num_classes - 1}] (or -1: unlabelled)")
        check_classes(labels, num_classes, f"node type {name}")
        y[base[name]:base[name] + labels.shape[0]] = labels
    if not src.labels:
        raise InputError("no node type has labels; node classification needs labels on at least one type")
    return y


def _global_splits(src: TypedSource, base: dict[str, int]) -> dict[str, np.ndarray]:
    out = {}
    for split in SPLITS:
        parts = [np.asarray(ids[split], dtype=np.int64) + base[name] for name, ids in sorted(src.splits.items())
                 if split in ids]
        out[split] = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    return out
