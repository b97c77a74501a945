"""The canonical dataset format written by the download stage (``graph.zarr``): one typed graph.

ID space: everything here is in **orig** ids. A graph has T node types and R edge types (``storage.schema``); its
nodes are numbered type after type (schema order), so node type t's own id ``i`` is the graph's orig id
``schema.orig_offsets()[t] + i``. A homogeneous graph is T = R = 1 and reads exactly as an untyped one.

- ``indptr`` int64 [N*R+1], ``indices`` [E] (index dtype, below): CSR of *incoming* edges whose row ``v * R + e``
  lists the sources u of v's type-e edges u -> v (messages flow u -> v); a node's edges of all types are the one
  range ``[indptr[v * R], indptr[(v + 1) * R])``. Edge types that are undirected (same source and target type) are
  stored symmetrised; self-loops and duplicate edges are removed; each row is sorted.
- ``edge_attr`` [E, D] (graphs with edge features only): row i holds the attributes of the edge ``indices[i] ->``
  its row's node, aligned with ``indices`` (a reversed edge of a symmetrised graph has its edge's attributes;
  ``stages.download.canonical.csr_with_edge_attr`` says which duplicate's win); every value finite; attr
  ``num_edge_features`` = D.
- ``x/<node type>`` [N_t, F_t] for the node types that have features (the dataset's dtype, every value finite).
- ``y`` int64 [N] (-1 = unlabelled; a labelled type's classes are ``[0, num_classes_t)``).
- ``split/train``, ``split/valid``, ``split/test``: orig ids of the index dtype (OGB's split names).
- ``edge_split/train``, ``edge_split/valid``, ``edge_split/test`` (link prediction only): index dtype [2, E_s] (src,
  dst) orig ids of one target edge type's positives (``stages.download.edge_split``); the CSR above is then the
  message-passing graph, without the valid and test edges.
- ``edge_split_neg/<split>`` (datasets that fix their evaluation negatives, OGB's ``ogbl-*``; valid and test
  only), by the attr ``link_eval``:
  - ``per-positive`` (ogbl-citation2): int64 [E_s, K] orig ids of dst nodes; row i holds the K negatives of
    positive ``edge_split/<split>[:, i]``: the pairs (its src, each of them), ranked against it alone (MRR);
  - ``shared`` (ogbl-collab): int64 [2, E_neg] (src, dst) orig ids, the one set of negative pairs every positive
    of the split is ranked against (Hits@K against all of them).
- attrs: ``schema`` (``GraphSchema.to_dict``), name, source, num_nodes, num_edges, num_features, num_classes,
  directed, split sizes, edges per edge type; with edge splits ``link_edge_type`` (its key) and their sizes; with
  negatives ``link_eval`` and ``edge_split_neg_shapes`` ({split: shape}); ``index_dtype``.

Index dtype: node ids (``indices``, ``split/*``, ``edge_split/*``) are stored as int32 when every id fits (N < 2**31,
``index_dtype``), else int64; offsets (``indptr``), ``y`` and the negatives are always int64. Half the bytes of the
largest array on disk and in every page cache that streams it. Artifacts written before this rule hold int64 ids
(no ``index_dtype`` attr); both read the same.

Reading: ``GraphArtifact.read()`` widens ids to int64 while reading chunk by chunk (no second copy), so every
consumer sees int64 as before; ``read(native=True)`` keeps the stored dtype, and ``GraphArtifact.zarr_array(path)``
opens one array (e.g. ``indices``) for a consumer that streams it chunk by chunk (``storage.spill.spill_array``).

Writing: ``write_graph`` writes every array chunk by chunk, casting each chunk to its stored dtype, so a ``Graph``
whose ``indices`` or features are memory maps larger than memory (the download stage's external-sort path) is
written with the same chunking, hence the same bytes, as an in-memory one. The ``edge_split/*`` arrays [2, E_s]
are chunked along their columns (``zarr_io.write_columns``: ~64 MiB chunks, one chunk up to 8 M int32 pairs, as
they always were), so a train split held as a memory map (``stages.download.edge_split_stream``) is written a
chunk at a time too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import zarr

from storage.errors import ArtifactError
from storage.schema import GraphSchema, only_type
from storage.store import ArtifactHandle
from storage.summaries import DownloadSummary
from storage.writer import StageWriter
from storage.zarr_io import (
    attr_str,
    open_array_at,
    open_group,
    open_subgroup,
    read_array,
    read_ids,
    write_array,
    write_columns,
)

SPLITS = ("train", "valid", "test")
# how fixed evaluation negatives are laid out and ranked against the positives (module docstring)
LINK_EVALS = ("per-positive", "shared")
_GROUP = "graph.zarr"


@dataclass
class Graph:
    """A whole typed graph in orig ids, in memory (module docstring)."""

    schema: GraphSchema
    indptr: np.ndarray                 # int64 [N*R+1]: row v * R + e
    indices: np.ndarray                # int64 [E]: orig ids
    features: dict[str, np.ndarray]    # node type -> [N_t, F_t], featured types only (empty: not read)
    y: np.ndarray                      # int64 [N]
    splits: dict[str, np.ndarray]      # orig ids
    directed: bool = False
    name: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    edge_splits: dict[str, np.ndarray] = field(default_factory=dict)   # link prediction: split -> [2, E] orig
    link_edge_type: str | None = None                                   # the key of the split edges' type
    edge_split_negatives: dict[str, np.ndarray] = field(default_factory=dict)   # split -> fixed eval negatives
    link_eval: str | None = None                        # their layout: a LINK_EVALS entry (module docstring)
    edge_attr: np.ndarray | None = None     # [E, D] aligned with indices (module docstring); None: no edge features

    @classmethod
    def homogeneous(cls, indptr: np.ndarray, indices: np.ndarray, x: np.ndarray, y: np.ndarray,
                    splits: dict[str, np.ndarray], num_classes: int, **kwargs: Any) -> Graph:
        """The one-type graph of an untyped dataset (node type ``node``, edge type ``(node, edge, node)``)."""
        schema = GraphSchema.homogeneous(int(indptr.shape[0] - 1), int(x.shape[1]), int(num_classes))
        return cls(schema, indptr, indices, {"node": x}, y, splits, **kwargs)

    @property
    def num_nodes(self) -> int:
        return self.schema.num_nodes

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def node_indptr(self) -> np.ndarray:
        """int64 [N+1]: node v's incoming edges of every type are ``indices[node_indptr[v]:node_indptr[v+1]]`` (a
        view of ``indptr``; within a node sorted by edge type, then source)."""
        return self.indptr[::self.schema.num_edge_types]

    @property
    def x(self) -> np.ndarray:
        """The features of the one featured node type (every homogeneous graph); typed code reads ``features``."""
        return self.features[only_type(self.features, "x")]

    @property
    def num_edge_features(self) -> int:
        """D of ``edge_attr`` (0: the graph has no edge features)."""
        return 0 if self.edge_attr is None else int(self.edge_attr.shape[1])

    @property
    def num_classes(self) -> int:
        return max((t.num_classes for t in self.schema.node_types), default=0)

    @property
    def num_features(self) -> int:
        """The widest featured type's columns (the only one's, for a homogeneous graph)."""
        return max((t.num_features or 0 for t in self.schema.node_types), default=0)

    def edges_per_type(self) -> dict[str, int]:
        r = self.schema.num_edge_types
        per_row = np.diff(self.indptr)
        return {e.key: int(per_row[i::r].sum()) for i, e in enumerate(self.schema.edge_types)}

    def attrs(self) -> dict[str, Any]:
        dtypes = sorted({str(x.dtype) for x in self.features.values()})
        return {
            "schema": self.schema.to_dict(),
            "name": self.name,
            "source": self.source,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_features": self.num_features,
            "feature_dtype": ",".join(dtypes) or None,
            "num_classes": int(self.num_classes),
            "directed": bool(self.directed),
            "split_sizes": {s: int(self.splits[s].shape[0]) for s in SPLITS},
            "edges_per_type": self.edges_per_type(),
            **({"link_edge_type": self.link_edge_type,
                "edge_split_sizes": {s: int(self.edge_splits[s].shape[1]) for s in SPLITS}}
               if self.edge_splits else {}),
            **({"link_eval": self.link_eval,
                "edge_split_neg_shapes": {s: list(a.shape) for s, a in self.edge_split_negatives.items()}}
               if self.edge_split_negatives else {}),
            **({"num_edge_features": self.num_edge_features} if self.edge_attr is not None else {}),
            "index_dtype": str(index_dtype(self.num_nodes)),
            **self.extra,
        }


def index_dtype(num_nodes: int) -> np.dtype:
    """The stored dtype of node ids (module docstring): int32 when every id fits (N < 2**31), else int64."""
    return np.dtype(np.int32 if num_nodes < 2**31 else np.int64)


def write_graph(writer: StageWriter, graph: Graph, *, progress: bool = False) -> dict[str, Any]:
    """Write ``graph`` as the artifact's ``graph.zarr`` chunk by chunk (its arrays may be memory maps: module
    docstring); returns its attrs."""
    root = open_group(writer.file_url(_GROUP), mode="w")
    ids = index_dtype(graph.num_nodes)
    write_array(root, "indptr", graph.indptr, dtype=np.int64)
    write_array(root, "indices", graph.indices, progress=progress, dtype=ids)
    if graph.edge_attr is not None:
        if graph.edge_attr.ndim != 2 or graph.edge_attr.shape[0] != graph.num_edges:
            raise ValueError(f"edge_attr of shape {graph.edge_attr.shape} for {graph.num_edges} edges")
        write_array(root, "edge_attr", graph.edge_attr, progress=progress)
    featured = {t.name for t in graph.schema.featured}
    if set(graph.features) != featured:
        raise ValueError(f"features given for {sorted(graph.features)}, the schema's featured types are "
                         f"{sorted(featured)}")
    x_group = root.create_group("x")
    for name, x in graph.features.items():
        write_array(x_group, name, x, progress=progress)
    write_array(root, "y", graph.y, dtype=np.int64)
    split = root.create_group("split")
    for name in SPLITS:
        write_array(split, name, graph.splits[name], dtype=ids)
    if graph.edge_splits:
        if set(graph.edge_splits) != set(SPLITS) or graph.link_edge_type is None:
            raise ValueError(f"edge splits {sorted(graph.edge_splits)} need all of {SPLITS} and link_edge_type")
        edge_split = root.create_group("edge_split")
        for name in SPLITS:
            write_columns(edge_split, name, graph.edge_splits[name], dtype=ids)
    if graph.edge_split_negatives:
        check_negatives(graph.edge_split_negatives, graph.edge_splits, graph.link_eval)
        negatives = root.create_group("edge_split_neg")
        for name, neg in graph.edge_split_negatives.items():
            write_array(negatives, name, neg, progress=progress, dtype=np.int64)
    attrs = graph.attrs()
    root.attrs.update(attrs)
    return attrs


def check_negatives(negatives: dict[str, np.ndarray], edge_splits: dict[str, np.ndarray],
                    link_eval: str | None) -> None:
    """Fixed evaluation negatives fit their positives in ``link_eval``'s layout (module docstring); ValueError
    otherwise (a loader's bug, not the user's)."""
    if link_eval not in LINK_EVALS or not edge_splits or not set(negatives) <= set(SPLITS):
        raise ValueError(f"negatives for {sorted(negatives)} need edge splits and link_eval in {LINK_EVALS}, got "
                         f"{link_eval!r}")
    for name, neg in negatives.items():
        fits = neg.shape[0] == edge_splits[name].shape[1] if link_eval == "per-positive" else neg.shape[0] == 2
        if neg.ndim != 2 or not fits:
            raise ValueError(f"{link_eval} negatives of split {name} have shape {neg.shape}; positives "
                             f"{edge_splits[name].shape}")


class GraphArtifact(ArtifactHandle):
    """The download stage's artifact, read through its manifest."""

    STAGE = "download"

    @cached_property
    def summary(self) -> DownloadSummary:
        return DownloadSummary.from_json(self.manifest.summary)

    @property
    def num_nodes(self) -> int:
        return int(self.summary.num_nodes)

    @property
    def schema(self) -> GraphSchema:
        return GraphSchema.from_dict(self.summary.schema)

    @property
    def num_edge_features(self) -> int:
        """D of the graph's ``edge_attr`` (0: none)."""
        return int(self.summary.num_edge_features)

    def read(self, features: bool = True, negatives: bool = False, edges: bool = True, *,
             native: bool = False) -> Graph:
        """The whole graph; ``features=False`` skips ``x`` (the partition stage needs topology only);
        ``edges=False`` skips ``edge_attr``;
        ``negatives=True`` also reads the fixed evaluation negatives (ogbl-citation2's are 1.4 GB, which only the
        partition stage needs: without them ``edge_split_negatives`` is empty, ``link_eval`` still says);
        ``native=True`` keeps node ids in their stored dtype (int32 below 2**31 nodes) instead of widening them to
        int64 (module docstring)."""
        return _read_graph(self._url(_GROUP), features=features, negatives=negatives, edges=edges, native=native)

    def zarr_array(self, path: str) -> zarr.Array:
        """One array of ``graph.zarr`` (``indices``, ``x/<node type>``, ``split/train``, ...) opened for reading, in
        its stored dtype: for consumers that stream it chunk by chunk instead of reading it whole."""
        return open_array_at(self._url(f"{_GROUP}/{path}"))

    def x_array(self, node_type: str) -> zarr.Array:
        """A featured node type's ``x`` [N_t, F_t], opened lazily (nothing read): for stages that stream it."""
        return self.zarr_array(f"x/{node_type}")

    def labels(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``y`` and the node splits alone (O(N), no edges, no x)."""
        root = open_group(self._url(_GROUP))
        return read_array(root, "y"), {name: read_array(open_subgroup(root, "split"), name) for name in SPLITS}


def _read_graph(url: str, *, features: bool = True, negatives: bool = False, edges: bool = True,
                native: bool = False) -> Graph:
    root = open_group(url)
    attrs = dict(root.attrs)
    if "schema" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe typed graph (no schema attr); rerun the download stage")
    schema = GraphSchema.from_dict(attrs["schema"])   # type: ignore[arg-type]
    splits = {name: read_ids(open_subgroup(root, "split"), name, native) for name in SPLITS}
    x_group = open_subgroup(root, "x") if features else None
    known = {"schema", "name", "source", "num_nodes", "num_edges", "num_features", "feature_dtype", "num_classes",
             "directed", "split_sizes", "edges_per_type", "link_edge_type", "edge_split_sizes", "link_eval",
             "edge_split_neg_shapes", "num_edge_features", "index_dtype"}
    link_edge_type = attrs.get("link_edge_type")
    edge_splits = {name: read_ids(open_subgroup(root, "edge_split"), name, native) for name in SPLITS} \
        if link_edge_type is not None else {}
    link_eval = attrs.get("link_eval")
    neg_shapes = attrs.get("edge_split_neg_shapes")   # which splits have negatives
    edge_split_negatives = {name: read_array(open_subgroup(root, "edge_split_neg"), name)
                            for name in (neg_shapes if negatives and isinstance(neg_shapes, Mapping) else ())}
    return Graph(
        schema=schema,
        indptr=read_array(root, "indptr"),
        indices=read_ids(root, "indices", native),
        features={t.name: read_array(x_group, t.name) for t in schema.featured} if x_group is not None else {},
        y=read_array(root, "y"),
        splits=splits,
        directed=bool(attrs["directed"]),
        name=attr_str(attrs, "name", url, default=""),
        source=attr_str(attrs, "source", url, default=""),
        extra={k: v for k, v in attrs.items() if k not in known},
        edge_splits=edge_splits,
        link_edge_type=None if link_edge_type is None else str(link_edge_type),
        edge_split_negatives=edge_split_negatives,
        link_eval=None if link_eval is None else str(link_eval),
        edge_attr=read_array(root, "edge_attr") if edges and "num_edge_features" in attrs else None,
    )
