"""Typed sources → one ``Graph``: per-type ids, features, labels and splits become the graph's orig id space.

Every typed source (``synthetic-hetero``, ``ogbn-mag``, typed ``files``) hands its graph over per type, in each
type's own ids, as a :class:`TypedSource`; :func:`build_graph` numbers the nodes type after type (schema order),
adds the reverse relations on request and builds the one incoming CSR of ``storage.graph``. Homogeneous sources
build their ``Graph`` directly (``Graph.homogeneous``): the same layout with one type.

``add_reverse`` follows PyG's ``ToUndirected``: an edge type between two node types gets a reverse type
``(dst, rev_<rel>, src)``; one within a node type (``paper cites paper``) is symmetrised in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stages.download.canonical import Relation, check_classes, check_finite, typed_csr_incoming
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.schema import EdgeType, GraphSchema, NodeType


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


def typed_schema(src: TypedSource, *, add_reverse: bool) -> GraphSchema:
    """The schema of ``src`` (reverse edge types added if ``add_reverse``)."""
    node_types = tuple(NodeType(name, int(n), int(src.features[name].shape[1]) if name in src.features else None,
                                int(src.labels[name][1]) if name in src.labels else 0)
                       for name, n in src.num_nodes.items())
    edge_types = set(src.edges)
    if add_reverse:
        edge_types |= {e.reverse() for e in src.edges if e.src != e.dst}
    return GraphSchema(node_types, tuple(edge_types))


def build_graph(src: TypedSource, *, add_reverse: bool) -> Graph:
    """The ``Graph`` of ``src``: checked (one line naming the type), offset, reversed on request, one CSR."""
    schema = typed_schema(src, add_reverse=add_reverse)
    offsets = schema.orig_offsets()
    base = {t.name: int(offsets[i]) for i, t in enumerate(schema.node_types)}
    for name, x in src.features.items():
        if x.ndim != 2 or x.shape[0] != src.num_nodes[name]:
            raise InputError(f"features of node type {name} have shape {x.shape}; expected [{src.num_nodes[name]}, F]")
        check_finite(x, f"the features (x) of node type {name}")
    relations = [_relation(schema, src, base, e, add_reverse) for e in schema.edge_types]
    indptr, indices = typed_csr_incoming(relations, schema.num_nodes)
    return Graph(schema, indptr, indices, dict(src.features), _global_labels(src, schema, base),
                 _global_splits(src, base), directed=not add_reverse, name=src.name, source=src.source,
                 extra=dict(src.extra))


def _relation(schema: GraphSchema, src: TypedSource, base: dict[str, int], e: EdgeType,
              add_reverse: bool) -> Relation:
    """Edge type e's edges in the graph's orig ids; a reverse type is its forward type's edges swapped."""
    if e in src.edges:
        s, d = src.edges[e]
    else:   # a reverse made by add_reverse
        d, s = src.edges[EdgeType(e.dst, e.rel.removeprefix("rev_"), e.src)]
    source, target = e.src, e.dst
    s, d = np.asarray(s), np.asarray(d)
    for ids, node_type, what in ((s, source, "source"), (d, target, "target")):
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"edge type {e.key}: {what} ids have dtype {ids.dtype}; node ids must be integers")
        n = src.num_nodes[node_type]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise InputError(f"edge type {e.key}: {what} ids span [{int(ids.min())}, {int(ids.max())}] but node type "
                             f"{node_type} has {n} nodes; ids must be in [0, {n - 1}]")
    symmetrise = add_reverse and e.src == e.dst
    return Relation(s.astype(np.int64) + base[source], d.astype(np.int64) + base[target], symmetrise=symmetrise,
                    name=e.key)


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
