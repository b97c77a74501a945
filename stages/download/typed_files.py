"""The user's own typed graph as ``.npy`` files → ``storage.graph.Graph`` (through ``stages.download.typed``).

A ``files`` directory holding ``schema.json`` is a typed graph (README: "Your own typed graph"); every id is the
node's id within its type::

    schema.json                           {"node_types": {"paper": 736389, "author": 1134649, ...},
                                           "num_classes": {"paper": 349}, "name": "mag"}  (num_classes, name optional)
    nodes/<node type>/x.npy               optional features [N_t, F_t] (a type without them gets learnt embeddings)
    nodes/<node type>/y.npy               labelled types: int [N_t], -1 = unlabelled
    nodes/<node type>/{train,valid,test}_idx.npy   labelled types: ids within the type, disjoint, labelled
    edges/<src>___<rel>___<dst>/edge_index.npy     int [2, E]: row 0 ids of <src> nodes, row 1 ids of <dst> nodes

Node types keep the order of ``schema.json``. Each array is checked as the homogeneous layout's
(``stages.download.files_source``) and a problem is one line naming its file; ``add_reverse`` adds reverse edge
types as for every typed source. ``x.npy`` and ``edge_index.npy`` stay memory maps: the in-memory path copies the
edges into its sort, the streaming path (``sort``) reads them a chunk at a time; ``typed_file_sizes`` reads the
headers alone, for the memory estimates of ``stages.download.streamed``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np

from stages.download.files_source import _check_disjoint, _check_ids, _check_x, _load, _read_labels, _read_split
from stages.download.typed import TypedSource, build_graph
from stages.external_sort import SortSpace
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.schema import EdgeType

SCHEMA = "schema.json"
T = TypeVar("T")


def is_typed_dir(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, SCHEMA))


def load_typed_files(directory: str, *, add_reverse: bool, sort: SortSpace | None = None) -> Graph:
    """Load and validate the typed ``.npy`` dataset in ``directory`` (layout in the module docstring); with
    ``sort`` its CSR comes from the external sort (``typed.build_graph``)."""
    counts, num_classes, name = _read_schema(directory)
    features: dict[str, np.ndarray] = {}
    labels: dict[str, tuple[np.ndarray, int]] = {}
    splits: dict[str, dict[str, np.ndarray]] = {}
    for node_type, n in counts.items():
        folder = os.path.join(directory, "nodes", node_type)
        if os.path.isfile(os.path.join(folder, "x.npy")):
            features[node_type] = _in(folder, partial(_features, folder, n))
        if node_type in num_classes:
            y = _in(folder, partial(_read_labels, folder, n))
            labels[node_type] = (y, num_classes[node_type])
            splits[node_type] = _in(folder, partial(_splits, folder, n, y))
    edges = {e: _in(path, partial(_edges, path, e, counts)) for e, path in _edge_dirs(directory).items()}
    return build_graph(TypedSource(counts, edges, features, labels, splits, name=name,
                                   source=f"files({os.path.abspath(directory)})"), add_reverse=add_reverse,
                       sort=sort)


def typed_file_sizes(directory: str) -> tuple[dict[str, int], dict[EdgeType, int], dict[str, int]] | None:
    """(nodes per type, listed edges per edge type, bytes of a feature row per featured type) from ``schema.json``
    and the ``.npy`` headers (memory maps: nothing read), or None where a file is missing or broken (the loader
    names the problem)."""
    try:
        counts = _read_schema(directory)[0]
        edges = {e: int(_load(path, "edge_index.npy", mmap=True).shape[-1])
                 for e, path in _edge_dirs(directory).items()}
        row_bytes = {}
        for node_type in counts:
            folder = os.path.join(directory, "nodes", node_type)
            if os.path.isfile(os.path.join(folder, "x.npy")):
                x = _load(folder, "x.npy", mmap=True)
                row_bytes[node_type] = x.dtype.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))
        return counts, edges, row_bytes
    except (InputError, IndexError):
        return None


def _in(folder: str, read: Callable[[], T]) -> T:
    """``read()``, its one-line error prefixed with the folder the file is in (``x.npy`` alone is ambiguous)."""
    try:
        return read()
    except InputError as err:
        raise InputError(f"{folder}: {err}") from None


def _read_schema(directory: str) -> tuple[dict[str, int], dict[str, int], str]:
    path = os.path.join(directory, SCHEMA)
    try:
        with open(path, encoding="utf-8") as f:
            schema: Any = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path} is not valid JSON ({err}); fix it (README: your own typed graph)") from None
    unknown = set(schema) - {"node_types", "num_classes", "name"} if isinstance(schema, dict) else set()
    if not isinstance(schema, dict) or unknown or not isinstance(schema.get("node_types"), dict) \
            or not schema["node_types"]:
        raise InputError(f"{path} must be an object with \"node_types\": {{type: node count, ...}} and optionally "
                         f"\"num_classes\": {{type: classes}} and \"name\""
                         + (f" (unknown key(s): {', '.join(sorted(unknown))})" if unknown else ""))
    counts = _int_map(schema["node_types"], f"{path} node_types", 0)
    num_classes = _int_map(schema.get("num_classes", {}), f"{path} num_classes", 2)
    if not num_classes:
        raise InputError(f"{path} gives no num_classes: name the labelled node type(s), e.g. "
                         f"\"num_classes\": {{\"{next(iter(counts))}\": 10}}")
    missing = sorted(set(num_classes) - set(counts))
    if missing:
        raise InputError(f"{path} num_classes names node type(s) {', '.join(missing)} not in node_types")
    return counts, num_classes, str(schema.get("name", os.path.basename(os.path.abspath(directory))))


def _int_map(value: Any, what: str, least: int) -> dict[str, int]:
    if not isinstance(value, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                                              for v in value.values()):
        raise InputError(f"{what} must map node type names to integers >= {least}, got {value!r}")
    return {str(k): int(v) for k, v in value.items()}


def _features(folder: str, n: int) -> np.ndarray:
    x = _load(folder, "x.npy", mmap=True)
    _check_x(x)
    if x.shape[0] != n:
        raise InputError(f"x.npy has {x.shape[0]} rows but schema.json gives the type {n} nodes; one row per node")
    return x


def _splits(folder: str, n: int, y: np.ndarray) -> dict[str, np.ndarray]:
    out = {split: _read_split(folder, split, n, y) for split in SPLITS}
    _check_disjoint(out)
    return out


def _edge_dirs(directory: str) -> dict[EdgeType, str]:
    root = os.path.join(directory, "edges")
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    if not names:
        raise InputError(f"{root} holds no edge type; add edges/<src>___<rel>___<dst>/edge_index.npy")
    out = {}
    for name in names:
        try:
            out[EdgeType.from_key(name)] = os.path.join(root, name)
        except ValueError:
            raise InputError(f"{os.path.join(root, name)}: an edge type folder is named <src>___<rel>___<dst> "
                             f"(three names joined by three underscores)") from None
    return out


def _edges(folder: str, e: EdgeType, counts: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    for node_type in (e.src, e.dst):
        if node_type not in counts:
            raise InputError(f"node type {node_type} is not in schema.json's node_types")
    ei = _load(folder, "edge_index.npy", mmap=True)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise InputError(f"edge_index.npy has shape {ei.shape}; it must be [2, E] (row 0 {e.src} ids, row 1 "
                         f"{e.dst} ids); transpose an [E, 2] array")
    _check_ids(ei[0], f"edge_index.npy row 0 ({e.src})", counts[e.src])
    _check_ids(ei[1], f"edge_index.npy row 1 ({e.dst})", counts[e.dst])
    return np.asarray(ei[0]), np.asarray(ei[1])
