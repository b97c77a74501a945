"""The user's own graph as ``.npy`` files in one directory → ``storage.graph.Graph``.

Expected files (README has the user-facing version):

- topology, exactly one of: ``edge_index.npy`` (int [2, E], row 0 = source, row 1 = destination) or
  ``indptr.npy`` + ``indices.npy`` (CSR of incoming edges: ``indices[indptr[v]:indptr[v+1]]`` are the sources of
  edges into v);
- ``x.npy`` [N, F] node features, finite, of dtype bool, any integer, float16, float32 or float64 (kept here;
  the features stage picks the stored dtype); N is taken from here (or from ``indptr``);
- ``y.npy`` [N] (or [N, 1]) integer labels, -1 = unlabelled;
- ``train_idx.npy``, ``valid_idx.npy``, ``test_idx.npy``: integer node ids, disjoint, labelled;
- optional ``edge_attr.npy`` [E, D] (or [E]) float edge features, finite, row i for edge i of the topology as
  listed (column i of ``edge_index.npy``, or entry i of ``indices.npy``); a reversed edge gets its edge's row;
- optional ``meta.json``: ``{"directed": false, "num_classes": max(y) + 1, "name": <directory name>}``.

Every problem is reported as one InputError line naming the file and what to do, before any heavy work.
Undirected graphs (the default) are symmetrised, so listing each edge once is enough.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.download.canonical import check_classes, check_finite, csr_with_edge_attr, to_csr_incoming
from stages.external_sort import EdgeChunks, array_chunks, csr_chunks
from stages.run_log import stage_log
from storage.errors import InputError
from storage.graph import SPLITS, Graph

SPLIT_FILES = {name: f"{name}_idx.npy" for name in SPLITS}
META_KEYS = {"directed": bool, "num_classes": int, "name": str}
JSON_TYPE_NAMES = {bool: "true/false", int: "integer", str: "string"}
# float16/32/64 (either byte order); float128 (longdouble) is left out: Zarr cannot store it, and the model
# computes in float32 anyway
X_FLOAT_BYTES = (2, 4, 8)


@dataclass
class FilesDataset:
    """A validated ``.npy`` dataset before its CSR is built: ``x`` and the topology stay memory-mapped."""

    topology: Topology
    x: np.ndarray
    y: np.ndarray
    splits: dict[str, np.ndarray]
    num_classes: int
    directed: bool
    name: str
    source: str
    edge_attr: np.ndarray | None

    def graph(self, indptr: np.ndarray, indices: np.ndarray, edge_attr: np.ndarray | None = None) -> Graph:
        """The graph with this canonical CSR."""
        return Graph.homogeneous(indptr=indptr, indices=indices, x=self.x, y=self.y, splits=self.splits,
                                 num_classes=self.num_classes, directed=self.directed, name=self.name,
                                 source=self.source, edge_attr=edge_attr)


@dataclass
class Topology:
    """The listed edges: ``edge_index.npy``'s rows (``dst``) or the CSR ``indices.npy`` with ``indptr``."""

    src: np.ndarray                    # memory-mapped
    dst: np.ndarray | None = None      # edge_index.npy's row 1 (memory-mapped)
    indptr: np.ndarray | None = None   # indptr.npy

    @property
    def num_nodes(self) -> int:
        return -1 if self.indptr is None else int(self.indptr.shape[0] - 1)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) whole (the in-memory path: a CSR's destinations cost an E-long int64 array)."""
        if self.dst is not None:
            return self.src, self.dst
        assert self.indptr is not None
        return self.src, np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))

    def chunks(self, edges_per_chunk: int) -> EdgeChunks:
        """(src, dst) chunks read from the memory maps (the streaming path)."""
        if self.dst is not None:
            return array_chunks(self.src, self.dst, edges_per_chunk)
        assert self.indptr is not None
        return csr_chunks(self.indptr, self.src, edges_per_chunk)


def load_files(directory: str) -> Graph:
    """Load and validate the ``.npy`` dataset in ``directory`` (layout in the module docstring), CSR in memory."""
    ds = open_files(directory)
    src, dst = ds.topology.arrays()
    num_nodes = ds.y.shape[0]
    if ds.edge_attr is None:
        return ds.graph(*to_csr_incoming(src, dst, num_nodes, directed=ds.directed))
    return ds.graph(*csr_with_edge_attr(src, dst, num_nodes, ds.edge_attr, directed=ds.directed))


def open_files(directory: str) -> FilesDataset:
    """Every check of ``load_files`` without building the CSR (the streaming path builds it from the memory maps)."""
    if not os.path.isdir(directory):
        raise InputError(f"dataset directory {directory} does not exist; pass the directory holding edge_index.npy "
                         "(or indptr.npy + indices.npy), x.npy, y.npy and *_idx.npy")
    meta = _read_meta(directory)
    x = _load(directory, "x.npy", mmap=True)
    _check_x(x)
    topology, num_nodes = _topology(directory, x.shape[0])
    y = _read_labels(directory, num_nodes)
    num_classes = _num_classes(meta, y)
    check_classes(y, num_classes, f"y.npy in {directory}")
    splits = {name: _read_split(directory, name, num_nodes, y) for name in SPLITS}
    _check_disjoint(splits)
    check_finite(x, f"x.npy in {directory}")   # reads all of x (0.06 s at products scale): after the cheap checks
    edge_attr = _read_edge_attr(directory, topology.src.shape[0])
    return FilesDataset(topology, x, y, splits, num_classes, meta.get("directed", False),
                        meta.get("name", os.path.basename(directory.rstrip("/"))),
                        f"files({os.path.abspath(directory)})", edge_attr)


def _read_edge_attr(directory: str, num_edges: int) -> np.ndarray | None:
    """``edge_attr.npy`` as float32 [E, D], or None without one; one error line for a wrong shape, dtype or a
    non-finite value (the model computes in float32, so the graph stores that)."""
    if not os.path.exists(_path(directory, "edge_attr.npy")):
        return None
    attr = _load(directory, "edge_attr.npy", mmap=True)
    if attr.ndim == 1:
        attr = attr[:, None]
    if attr.ndim != 2 or attr.shape[0] != num_edges or attr.shape[1] < 1:
        raise InputError(f"edge_attr.npy has shape {attr.shape} but the topology lists {num_edges} edges; it must "
                         f"be [{num_edges}, D] (row i: the features of edge i as listed)")
    if attr.dtype.kind not in "biuf":
        raise InputError(f"edge_attr.npy has dtype {attr.dtype}; edge features must be numbers (bool, integers "
                         f"or floats)")
    check_finite(attr, f"edge_attr.npy in {directory}")
    return np.asarray(attr, dtype=np.float32)


def _path(directory: str, name: str) -> str:
    return os.path.join(directory, name)


def _load(directory: str, name: str, *, mmap: bool = False) -> np.ndarray:
    """``np.load`` without pickles; ``mmap`` for the features, which may not fit in memory twice."""
    path = _path(directory, name)
    if not os.path.isfile(path):
        raise InputError(f"{name} is missing in {directory}; add it (see the dataset file layout in the README)")
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"{name} in {directory} is not a readable .npy array ({err}); re-save it with "
                         "numpy.save(path, array) from a plain numeric array") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive renamed to .npy loads as a mapping
        raise InputError(f"{name} in {directory} is not a single .npy array; save it with numpy.save")
    return arr


def _check_x(x: np.ndarray) -> None:
    """Shape [N, F] and a dtype the features stage can store (its ``dtype`` parameter says how)."""
    if x.ndim == 2 and (x.dtype.kind in "biu" or (x.dtype.kind == "f" and x.dtype.itemsize in X_FLOAT_BYTES)):
        return
    if x.dtype.kind == "V" and x.dtype.itemsize == 2:
        # numpy has no bfloat16: ml_dtypes' bfloat16 is saved with descr '<V2' and loads back as raw bytes
        raise InputError(f"x.npy has dtype {x.dtype}, which is how numpy saves a bfloat16 (ml_dtypes) array, and "
                         "the type is lost; save x as float16 or float32")
    raise InputError(f"x.npy has shape {x.shape} and dtype {x.dtype}; it must be a numeric [N, F] array (one "
                     "row of features per node) of bool, integers, float16, float32 or float64")


def _read_meta(directory: str) -> dict[str, Any]:
    path = _path(directory, "meta.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"meta.json in {directory} is not valid JSON ({err}); fix or delete it") from None
    if not isinstance(meta, dict):
        raise InputError(f"meta.json in {directory} must be a JSON object like {{\"directed\": false}}")
    for key, value in meta.items():
        want = META_KEYS.get(key)
        if want is None:
            raise InputError(f"meta.json has unknown key '{key}'; allowed keys: {', '.join(META_KEYS)}")
        # bool is an int in Python: "num_classes": true must not pass as 1.
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise InputError(f"meta.json key '{key}' is {value!r}; it must be a JSON {JSON_TYPE_NAMES[want]}")
    return meta


def _topology(directory: str, num_rows: int) -> tuple[Topology, int]:
    """(the listed edges, N) from either edge_index.npy or the CSR pair, validated."""
    has = {name: os.path.exists(_path(directory, name)) for name in ("edge_index.npy", "indptr.npy", "indices.npy")}
    if has["edge_index.npy"] and (has["indptr.npy"] or has["indices.npy"]):
        raise InputError(f"{directory} has both edge_index.npy and indptr.npy/indices.npy; keep only one topology")
    if has["edge_index.npy"]:
        src, dst = _edge_index(directory, num_rows)
        return Topology(src, dst=dst), num_rows
    if has["indptr.npy"] or has["indices.npy"]:
        topology = _csr(directory, num_rows)
        return topology, topology.num_nodes
    raise InputError(f"{directory} has no topology; add edge_index.npy ([2, E] ints) or indptr.npy + indices.npy")


def _edge_index(directory: str, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    ei = _load(directory, "edge_index.npy", mmap=True)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise InputError(f"edge_index.npy has shape {ei.shape}; it must be [2, E] (row 0 sources, row 1 "
                         "destinations); transpose an [E, 2] array")
    _check_ids(ei, "edge_index.npy", num_nodes)
    return ei[0], ei[1]


def _csr(directory: str, num_rows: int) -> Topology:
    indptr = _load(directory, "indptr.npy")
    indices = _load(directory, "indices.npy", mmap=True)
    for name, arr in (("indptr.npy", indptr), ("indices.npy", indices)):
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(f"{name} has shape {arr.shape} and dtype {arr.dtype}; it must be a 1-D integer array")
    num_nodes = indptr.shape[0] - 1
    if num_nodes != num_rows:
        raise InputError(f"indptr.npy describes {num_nodes} nodes but x.npy has {num_rows} rows; indptr needs "
                         "N + 1 entries for N feature rows")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise InputError(f"indptr.npy runs from {int(indptr[0])} to {int(indptr[-1])}; it must run from 0 to "
                         f"len(indices.npy) = {indices.shape[0]}")
    if np.any(np.diff(indptr) < 0):
        raise InputError("indptr.npy decreases somewhere; it must be non-decreasing (row v = "
                         "indices[indptr[v]:indptr[v+1]])")
    _check_ids(indices, "indices.npy", num_nodes)
    return Topology(indices, indptr=indptr)


def _check_ids(ids: np.ndarray, name: str, num_nodes: int) -> None:
    if not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"{name} has dtype {ids.dtype}; node ids must be integers (cast with .astype('int64'))")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        raise InputError(f"{name} has node ids in [{int(ids.min())}, {int(ids.max())}] but there are {num_nodes} "
                         f"nodes (rows of x.npy); ids must be in [0, {num_nodes - 1}]")


def _read_labels(directory: str, num_nodes: int) -> np.ndarray:
    y = _load(directory, "y.npy")
    if y.ndim == 2 and y.shape[1] == 1:  # OGB-style [N, 1]
        y = y[:, 0]
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"y.npy has shape {y.shape} and dtype {y.dtype}; it must be a 1-D integer array "
                         "(-1 = unlabelled)")
    if y.shape[0] != num_nodes:
        raise InputError(f"y.npy has {y.shape[0]} labels but the graph has {num_nodes} nodes; give one label per "
                         "node (-1 = unlabelled)")
    if y.size and int(y.min()) < -1:
        raise InputError(f"y.npy has label {int(y.min())}; labels must be >= 0, or -1 for unlabelled")
    return y.astype(np.int64)


def _num_classes(meta: dict[str, Any], y: np.ndarray) -> int:
    top = int(y.max(initial=-1))
    if top < 0:
        raise InputError("y.npy has no labelled node (all -1); label at least the training nodes")
    if "num_classes" not in meta:
        _note_empty_classes(y, top)
    num_classes = meta.get("num_classes", top + 1)
    if top >= num_classes:
        raise InputError(f"y.npy has label {top} but meta.json says num_classes={num_classes}; labels must be in "
                         f"[0, {num_classes - 1}], so raise num_classes or fix y")
    return int(num_classes)


def _note_empty_classes(y: np.ndarray, top: int) -> None:
    """One warning line when ``num_classes = max(y) + 1`` leaves classes without a labelled node: a stray label (10
    among classes 0-2) silently makes 11 classes, 8 of them empty, and the model still predicts them. Not an error:
    unused class ids can be deliberate (meta.json's num_classes then says so and silences this)."""
    present = np.unique(y[y >= 0])   # not a bincount: a stray label of 10**9 must not allocate 8 GB to be found
    bounds = np.concatenate([[-1], present])
    gaps = np.flatnonzero(np.diff(bounds) > 1)
    if not gaps.size:
        return
    spans = [(int(bounds[i]) + 1, int(bounds[i + 1]) - 1) for i in gaps]
    shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:5]) + (", ..." if len(spans) > 5 else "")
    empty = sum(b - a + 1 for a, b in spans)
    stage_log("download")(f"warning: y.npy: class{'es' if empty > 1 else ''} {shown} "
                          f"{'have' if empty > 1 else 'has'} no labelled node; num_classes={top + 1} because the "
                          f"largest label is {top} (fix a stray label, or set num_classes in meta.json to keep "
                          f"empty classes)")


def _read_split(directory: str, name: str, num_nodes: int, y: np.ndarray) -> np.ndarray:
    file = SPLIT_FILES[name]
    idx = _load(directory, file)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise InputError(f"{file} has shape {idx.shape} and dtype {idx.dtype}; it must be a 1-D integer array "
                         "of node ids")
    if name == "train" and idx.size == 0:
        raise InputError(f"{file} is empty; the training split needs at least one node")
    _check_ids(idx, file, num_nodes)
    idx = idx.astype(np.int64)
    if np.unique(idx).shape[0] != idx.shape[0]:
        raise InputError(f"{file} lists some node more than once; give each node once")
    unlabelled = int(np.count_nonzero(y[idx] < 0))
    if unlabelled:
        raise InputError(f"{file} has {unlabelled} node(s) labelled -1 in y.npy; splits may only hold labelled nodes")
    return idx


def _check_disjoint(splits: dict[str, np.ndarray]) -> None:
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            common = np.intersect1d(splits[a], splits[b])
            if common.size:
                raise InputError(f"{SPLIT_FILES[a]} and {SPLIT_FILES[b]} share {common.size} node(s) (e.g. node "
                                 f"{int(common[0])}); the splits must be disjoint")
