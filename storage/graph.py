"""The canonical dataset format written by the download stage (``graph.zarr``).

ID space: everything here is in **orig** ids (as the dataset numbers its nodes).

- ``indptr`` int64 [N+1], ``indices`` int64 [E]: CSR of *incoming* edges: ``indices[indptr[v]:indptr[v+1]]`` are
  the sources u of the edges u -> v (messages flow u -> v). Undirected graphs are stored symmetrised; self-loops and
  duplicate edges are removed; each row is sorted.
- ``x`` [N, F] (the dataset's dtype, every value finite), ``y`` int64 [N] (-1 = unlabelled).
- ``split/train``, ``split/valid``, ``split/test``: int64 orig ids (OGB's split names).
- attrs: name, source, num_nodes, num_edges, num_features, num_classes, directed, split sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from storage.errors import ArtifactError
from storage.store import ArtifactHandle, StageWriter
from storage.zarr_io import attr_int, attr_str, open_group, open_subgroup, read_array, write_array

SPLITS = ("train", "valid", "test")
_GROUP = "graph.zarr"


@dataclass
class Graph:
    """A whole graph in orig ids, in memory."""

    indptr: np.ndarray
    indices: np.ndarray
    x: np.ndarray | None
    y: np.ndarray
    splits: dict[str, np.ndarray]
    num_classes: int
    directed: bool = False
    name: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_features(self) -> int:
        return 0 if self.x is None else int(self.x.shape[1])

    def attrs(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_features": self.num_features,
            "feature_dtype": None if self.x is None else str(self.x.dtype),
            "num_classes": int(self.num_classes),
            "directed": bool(self.directed),
            "split_sizes": {s: int(self.splits[s].shape[0]) for s in SPLITS},
            **self.extra,
        }


def write_graph(writer: StageWriter, graph: Graph, *, progress: bool = False) -> dict[str, Any]:
    """Write ``graph`` as the artifact's ``graph.zarr``; returns its attrs."""
    root = open_group(writer.file_url(_GROUP), mode="w")
    write_array(root, "indptr", graph.indptr.astype(np.int64, copy=False))
    write_array(root, "indices", graph.indices.astype(np.int64, copy=False), progress=progress)
    assert graph.x is not None, "write_graph needs features"
    write_array(root, "x", graph.x, progress=progress)
    write_array(root, "y", graph.y.astype(np.int64, copy=False))
    split = root.create_group("split")
    for name in SPLITS:
        write_array(split, name, graph.splits[name].astype(np.int64, copy=False))
    attrs = graph.attrs()
    root.attrs.update(attrs)
    return attrs


class GraphArtifact(ArtifactHandle):
    """The download stage's artifact, read through its manifest."""

    STAGE = "download"

    @property
    def num_nodes(self) -> int:
        return int(self.manifest.summary["num_nodes"])

    def read(self, features: bool = True) -> Graph:
        """The whole graph; ``features=False`` skips ``x`` (the partition stage needs topology only)."""
        return _read_graph(self._url(_GROUP), features=features)


def _read_graph(url: str, *, features: bool = True) -> Graph:
    """Read the whole graph; ``features=False`` skips ``x`` (the partition stage needs topology only)."""
    root = open_group(url)
    attrs = dict(root.attrs)
    if "num_nodes" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe graph (no attrs); rerun the download stage")
    splits = {name: read_array(open_subgroup(root, "split"), name) for name in SPLITS}
    known = {"name", "source", "num_nodes", "num_edges", "num_features", "feature_dtype", "num_classes",
             "directed", "split_sizes"}
    return Graph(
        indptr=read_array(root, "indptr"),
        indices=read_array(root, "indices"),
        x=read_array(root, "x") if features else None,
        y=read_array(root, "y"),
        splits=splits,
        num_classes=attr_int(attrs, "num_classes", url),
        directed=bool(attrs["directed"]),
        name=attr_str(attrs, "name", url, default=""),
        source=attr_str(attrs, "source", url, default=""),
        extra={k: v for k, v in attrs.items() if k not in known},
    )
