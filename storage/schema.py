"""The typed graph model: node types, edge types, and the range table of a partitioned typed graph (docs/design.md §4).

A homogeneous graph is the one-type case (``GraphSchema.homogeneous``: node type ``node``, edge type
``(node, edge, node)``), not a second branch. Types are kept in sorted order, so a type's id (its position) is the
same whoever builds the schema from the same names.

ID spaces of a partitioned typed graph with P parts and T node types:

- ``orig``: per node type, as the dataset numbers it (0 .. N_t - 1);
- ``gid``: global, ordered by (part, type, orig): part p's nodes of type t are the contiguous range
  ``[type_bounds[p * T + t], type_bounds[p * T + t + 1])``, so a partition's nodes stay one range
  ``[bounds[p], bounds[p + 1])`` with ``bounds = type_bounds[::T]``, today's meaning;
- ``lid = gid - bounds[p]``, local to a partition, all types;
- ``tlid = gid - type_start(p, t)``: a type's rows within a partition (its feature rows, labels, CSR rows).

Owner and type of a gid are one ``searchsorted`` on the (P * T + 1)-entry table: no per-node table at run time.
Torch-free (numpy), like the rest of ``storage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

KEY_SEPARATOR = "___"   # OGB's: relations/<src>___<rel>___<dst>


@dataclass(frozen=True, order=True)
class NodeType:
    """A node type: its count, feature width (None: no features, learnable embeddings instead) and classes (0:
    unlabelled)."""

    name: str
    num_nodes: int
    num_features: int | None = None
    num_classes: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name, "node type")
        if self.num_nodes < 0 or (self.num_features is not None and self.num_features < 1) or self.num_classes < 0:
            raise ValueError(f"node type {self.name!r}: counts must be non-negative and a feature width positive")


@dataclass(frozen=True, order=True)
class EdgeType:
    """``(src, rel, dst)``: edges from ``src`` nodes to ``dst`` nodes under relation ``rel`` (PyG's triple)."""

    src: str
    rel: str
    dst: str

    def __post_init__(self) -> None:
        for part, what in ((self.src, "source type"), (self.rel, "relation"), (self.dst, "target type")):
            _check_name(part, what)

    @property
    def key(self) -> str:
        """``src___rel___dst``: the name of its folder (OGB's ``relations/`` layout)."""
        return KEY_SEPARATOR.join((self.src, self.rel, self.dst))

    @classmethod
    def from_key(cls, key: str) -> EdgeType:
        parts = key.split(KEY_SEPARATOR)
        if len(parts) != 3:
            raise ValueError(f"edge type key {key!r} is not src{KEY_SEPARATOR}rel{KEY_SEPARATOR}dst")
        return cls(*parts)

    def reverse(self, prefix: str = "rev_") -> EdgeType:
        """The reverse relation (``add_reverse``, as PyG's ``ToUndirected`` names it)."""
        return EdgeType(self.dst, prefix + self.rel, self.src)

    def as_tuple(self) -> tuple[str, str, str]:
        return self.src, self.rel, self.dst


def only_type(by_type: Mapping[str, Any], what: str) -> str:
    """The one node type keyed in ``by_type`` (every homogeneous graph's featured type), refused in one line when
    there are several: then the caller must name one."""
    if len(by_type) != 1:
        raise ValueError(f"{what} is the one featured node type's; this graph has {sorted(by_type)}: name a type")
    return next(iter(by_type))


def _check_name(name: str, what: str) -> None:
    # a name may not start or end with "_": ("paper_", "cites", ...) would share the key of ("paper", "_cites", ...)
    if not name or KEY_SEPARATOR in name or "/" in name or name != name.strip().strip("_"):
        raise ValueError(f"{what} name {name!r}: non-empty, no '/', no {KEY_SEPARATOR!r}, no surrounding spaces or "
                         "underscores")


@dataclass(frozen=True)
class GraphSchema:
    """The node and edge types of a graph, each sorted (its id is its position)."""

    node_types: tuple[NodeType, ...]
    edge_types: tuple[EdgeType, ...]

    def __post_init__(self) -> None:
        names = [t.name for t in self.node_types]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"node types must be at least one and distinct, got {names}")
        if len(set(self.edge_types)) != len(self.edge_types):
            raise ValueError("edge types must be distinct")
        for e in self.edge_types:
            if e.src not in names or e.dst not in names:
                raise ValueError(f"edge type {e.key} names a node type the schema does not have ({names})")
        object.__setattr__(self, "node_types", tuple(sorted(self.node_types, key=lambda t: t.name)))
        object.__setattr__(self, "edge_types", tuple(sorted(self.edge_types)))

    @classmethod
    def homogeneous(cls, num_nodes: int, num_features: int | None, num_classes: int) -> GraphSchema:
        """The one-type graph every homogeneous dataset is."""
        return cls((NodeType("node", num_nodes, num_features, num_classes),), (EdgeType("node", "edge", "node"),))

    @property
    def is_homogeneous(self) -> bool:
        return len(self.node_types) == 1 and len(self.edge_types) == 1

    @property
    def num_nodes(self) -> int:
        return sum(t.num_nodes for t in self.node_types)

    @property
    def num_edge_types(self) -> int:
        return len(self.edge_types)

    def orig_offsets(self) -> np.ndarray:
        """int64 [T + 1]: a graph's nodes are numbered type after type (PyG's ``to_homogeneous`` order), so type
        t's per-type orig id ``i`` is the graph's ``orig_offsets[t] + i``; ``[0, N]`` for one type."""
        return np.concatenate([[0], np.cumsum([t.num_nodes for t in self.node_types])]).astype(np.int64)

    def edge_type_id(self, edge_type: EdgeType) -> int:
        try:
            return self.edge_types.index(edge_type)
        except ValueError:
            raise KeyError(f"no edge type {edge_type.key!r} (have {', '.join(e.key for e in self.edge_types)})"
                           ) from None

    def node_type_of_orig(self) -> np.ndarray:
        """int8 (int64 past 127 types) [N]: the node type of every orig id (types are numbered one after
        another)."""
        counts = [t.num_nodes for t in self.node_types]
        return np.repeat(np.arange(len(counts), dtype=np.int8 if len(counts) < 128 else np.int64), counts)

    @property
    def featured(self) -> tuple[NodeType, ...]:
        """The node types with stored features (the others learn embeddings)."""
        return tuple(t for t in self.node_types if t.num_features is not None)

    def node_type(self, name: str) -> NodeType:
        return self.node_types[self.type_id(name)]

    def type_id(self, name: str) -> int:
        for t, node_type in enumerate(self.node_types):
            if node_type.name == name:
                return t
        raise KeyError(f"no node type {name!r} (have {', '.join(t.name for t in self.node_types)})")

    def edge_types_into(self, dst: str) -> tuple[EdgeType, ...]:
        """The edge types whose targets are ``dst`` nodes (the incoming CSRs of that type), in schema order."""
        return tuple(e for e in self.edge_types if e.dst == dst)

    @property
    def labelled(self) -> tuple[NodeType, ...]:
        return tuple(t for t in self.node_types if t.num_classes > 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (manifests, Zarr attrs)."""
        return {"node_types": [asdict(t) for t in self.node_types],
                "edge_types": [e.key for e in self.edge_types]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphSchema:
        return cls(tuple(NodeType(**t) for t in data["node_types"]),
                   tuple(EdgeType.from_key(k) for k in data["edge_types"]))


@dataclass(frozen=True)
class RangeTable:
    """Which gids part p owns of node type t (module docstring): ``type_bounds`` [P * T + 1], non-decreasing."""

    type_bounds: np.ndarray
    num_types: int

    def __post_init__(self) -> None:
        tb = np.asarray(self.type_bounds, dtype=np.int64)
        if self.num_types < 1:
            raise ValueError(f"a range table needs at least one node type, got {self.num_types}")
        if tb.ndim != 1 or (tb.size - 1) % self.num_types or tb.size < 2 or tb[0] != 0 or np.any(np.diff(tb) < 0):
            raise ValueError("type_bounds: P * T + 1 non-decreasing gids from 0")
        object.__setattr__(self, "type_bounds", tb)

    @classmethod
    def from_counts(cls, count_of_part_type: np.ndarray) -> RangeTable:
        """From ``count[p, t]``: the nodes of type t that part p owns."""
        counts = np.asarray(count_of_part_type, dtype=np.int64)
        return cls(np.concatenate([[0], np.cumsum(counts.reshape(-1))]), int(counts.shape[1]))

    @property
    def num_parts(self) -> int:
        return (self.type_bounds.size - 1) // self.num_types

    @property
    def bounds(self) -> np.ndarray:
        """[P + 1]: part p owns ``[bounds[p], bounds[p + 1])``, all types."""
        return self.type_bounds[::self.num_types]

    def type_range(self, part: int, node_type: int) -> tuple[int, int]:
        k = part * self.num_types + node_type
        return int(self.type_bounds[k]), int(self.type_bounds[k + 1])

    def ranges_of_type(self, node_type: int) -> tuple[np.ndarray, np.ndarray]:
        """``(start[P], stop[P])``: each part's gids of type t (a per-type feature store's rows; unlike ``bounds``
        the ranges of one type are not adjacent across parts)."""
        first = self.type_bounds[node_type:-1:self.num_types]
        return first, self.type_bounds[node_type + 1::self.num_types]

    def _range_of(self, gid: np.ndarray) -> np.ndarray:
        """The (part * T + type) range holding each gid."""
        if gid.size and (gid.min() < 0 or gid.max() >= self.type_bounds[-1]):
            raise IndexError(f"gids must lie in [0, {int(self.type_bounds[-1])})")
        # right side: an empty (p, t) range shares its start with the next one, which owns the gid
        return np.searchsorted(self.type_bounds, gid, side="right") - 1

    def locate(self, gid: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(owner part, node type)`` of each gid."""
        k = self._range_of(np.asarray(gid, dtype=np.int64))
        return k // self.num_types, k % self.num_types

    def tlid(self, gid: np.ndarray | Sequence[int]) -> np.ndarray:
        """A gid's row among its part's nodes of its type."""
        gid = np.asarray(gid, dtype=np.int64)
        return gid - self.type_bounds[self._range_of(gid)]
