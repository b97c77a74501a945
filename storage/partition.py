"""The partition artifact format (``book.zarr`` + ``part-<p>.zarr``), written by the partition stage.

ID spaces (docs/design.md):

- ``orig``: dataset ids. ``gid``: global ids after relabelling, so that partition p owns the contiguous range
  ``[bounds[p], bounds[p+1])``. ``lid = gid - bounds[p]``: local to partition p.
- ``book.zarr``: ``bounds`` int64 [P+1], ``type_bounds`` int64 [P*T+1] (``storage.schema.RangeTable``: part p's
  nodes of type t are ``[type_bounds[p*T+t], type_bounds[p*T+t+1])``; gids follow (part, type, orig)),
  ``orig_of_gid`` [N], ``gid_of_orig`` [N] (ids, see below); attrs: the graph's ``schema``, the figures and
  ``id_dtype``.
- ``part-<p>.zarr``: ``indptr`` int64 [n_p*R+1] over (lid, edge type) rows ``lid * R + e``, ``indices`` [e_p] (ids)
  in **gids**: the CSR of incoming edges of the nodes p owns (over lids when R = 1). Concatenating the
  parts' CSRs (offsetting indptr) gives the whole graph's CSR in gid order. With edge features (``storage.graph``)
  also ``edge_attr`` float32 [e_p, D] aligned with ``indices`` (attr ``num_edge_features``).
- Edge ids: an edge's **egid** is its position in that concatenation, so part p stores (owns) the egids
  ``[edge_bounds[p], edge_bounds[p+1])`` (``PartitionArtifact.edge_bounds``, from the parts' edge counts) and an
  edge's **elid** = egid - edge_bounds[p] is its position in part p's ``indices``. An edge is owned by the part
  of its dst, which stores it. With link prediction's edge splits
  (``storage.graph``) also ``edge_split/<split>`` int64 [2, E] (src, dst) in **gids**: the split's positives whose
  dst p owns, sorted by dst. With fixed evaluation negatives (``storage.graph``'s ``link_eval``, summary attr
  ``link_eval``) also ``edge_split_neg/<split>`` in **gids**, each kept with the part that owns its dst, as the
  positives are: ``per-positive``: int64 [E, K], row i the negative dsts of ``edge_split/<split>[:, i]`` (same
  order, same src); ``shared``: int64 [2, E_neg] (src, dst), the negative pairs whose dst p owns, sorted by dst
  (the split's whole set is every part's together: each rank scores its own share and the ranks combine their
  top-K scores, instead of every rank scoring them all).
- Id dtype on disk (``id_dtype``): the parts' ``indices`` and the book's ``orig_of_gid``/``gid_of_orig`` are int32
  when N < 2**31, else int64 (``id_dtype(N)``; recorded as the attr ``id_dtype`` of the book and of each part,
  absent = int64, as artifacts written before it were). At 14 M nodes and 400 M entries that halves the largest
  files (3.2 GB of indices to 1.6 GB). Offsets (``indptr``, ``bounds``), edge splits and negatives stay int64.
  Every reader here (``csr``, ``book``, ``edge_split``, ...) widens to int64, so a consumer never sees int32.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import fsspec
import numpy as np
import zarr

from storage.errors import ArtifactError
from storage.schema import GraphSchema, RangeTable
from storage.store import ArtifactHandle
from storage.summaries import PartitionSummary
from storage.writer import StageWriter, WorkDir
from storage.zarr_io import attr_int, open_array, open_group, open_subgroup, read_array, read_ids, write_array

_BOOK = "book.zarr"
# int32 ids fit below this many nodes (the largest gid is N - 1)
INT32_NODES = 2**31


def id_dtype(num_nodes: int) -> np.dtype:
    """The on-disk dtype of node ids of a graph of ``num_nodes`` nodes (module docstring)."""
    return np.dtype(np.int32) if num_nodes < INT32_NODES else np.dtype(np.int64)


def _part_name(p: int) -> str:
    return f"part-{p}.zarr"


@dataclass
class PartitionBook:
    """Who owns which gid; the only id mapping a worker needs at run time is ``bounds``."""

    bounds: np.ndarray       # int64 [P+1]
    orig_of_gid: np.ndarray  # int64 [N]
    gid_of_orig: np.ndarray  # int64 [N]
    type_bounds: np.ndarray | None = None   # int64 [P*T+1]; None: one node type (== bounds)

    def range_table(self) -> RangeTable:
        """Owner, node type and tlid of gids (``storage.schema.RangeTable``)."""
        return RangeTable(self.bounds if self.type_bounds is None else self.type_bounds,
                          1 if self.type_bounds is None else (self.type_bounds.shape[0] - 1) // self.num_partitions)

    @property
    def num_partitions(self) -> int:
        return int(self.bounds.shape[0] - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.bounds[-1])

    def owner(self, gid: np.ndarray) -> np.ndarray:
        """Partition of each gid (contiguous ranges, so a searchsorted, no per-node table)."""
        return np.searchsorted(self.bounds, gid, side="right") - 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.bounds)

    def type_ids_by_tgid(self, node_type: int, first_orig: int, part: int | None = None) -> np.ndarray:
        """int64: for each tgid of ``node_type`` (its nodes numbered part by part, ``stages.runtime.typed_rows``),
        the node's id within its type (orig id - ``first_orig``, the type's first); part ``part``'s only, if given."""
        table = self.range_table()
        parts = range(self.num_partitions) if part is None else [part]
        return np.concatenate([self.orig_of_gid[slice(*table.type_range(p, node_type))] for p in parts]) - first_orig


@dataclass
class PartCSR:
    """Partition p's incoming-edge CSR: row ``lid * R + e`` lists the gids of lid's type-e in-neighbours (R edge
    types; rows are lids when R = 1)."""

    part: int
    start_gid: int
    indptr: np.ndarray   # int64 [n_p * R + 1], over (lid, edge type) rows
    indices: np.ndarray  # int64 [e_p], gids
    num_edge_types: int = 1

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1) // self.num_edge_types

    @property
    def node_indptr(self) -> np.ndarray:
        """[n_p + 1]: lid's in-edges of every type are ``indices[node_indptr[lid]:node_indptr[lid + 1]]``."""
        return self.indptr[::self.num_edge_types]


def write_book(writer: StageWriter | WorkDir, book: PartitionBook, attrs: dict[str, Any]) -> None:
    """Write the artifact's ``book.zarr`` (``attrs``: the partitioning's figures, kept as group attrs)."""
    g = open_group(writer.file_url(_BOOK), mode="w")
    ids = id_dtype(book.num_nodes)
    write_array(g, "bounds", book.bounds.astype(np.int64, copy=False))
    write_array(g, "orig_of_gid", book.orig_of_gid.astype(ids, copy=False))
    write_array(g, "gid_of_orig", book.gid_of_orig.astype(ids, copy=False))
    write_array(g, "type_bounds", book.range_table().type_bounds)
    g.attrs.update({**attrs, "id_dtype": str(ids)})


def read_book(out: StageWriter | WorkDir) -> PartitionBook:
    """The book a build has written into its work directory (``write_book``), before the artifact is published:
    what the partition stage's units read on a worker (``stages.partition.units``)."""
    return _read_book(out.file_url(_BOOK))


def _read_book(url: str) -> PartitionBook:
    g = open_group(url)
    return PartitionBook(read_array(g, "bounds"), read_ids(g, "orig_of_gid"), read_ids(g, "gid_of_orig"),
                         read_array(g, "type_bounds"))


def remove_parts(out: StageWriter | WorkDir, parts: Iterable[int]) -> None:
    """Delete the ``part-<p>.zarr`` stores of ``parts`` from ``out`` where present: a unit rerun after its worker
    died (Dask reschedules it) writes each of its parts from nothing, so no file of the first try's survives."""
    for p in parts:
        fs, path = fsspec.core.url_to_fs(out.file_url(_part_name(p)))
        if fs.exists(path):
            fs.rm(path, recursive=True)


def write_part(writer: StageWriter, csr: PartCSR, *, num_nodes: int, progress: bool = False,
               edge_splits: dict[str, np.ndarray] | None = None,
               edge_split_negatives: dict[str, np.ndarray] | None = None,
               edge_attr: np.ndarray | None = None) -> None:
    """Write partition ``csr.part``'s CSR as the artifact's ``part-<p>.zarr``, with its ``edge_splits`` (split ->
    [2, E] gids whose dst it owns) and ``edge_split_negatives`` (module docstring) when the graph has them.
    ``num_nodes``: the whole graph's, which decides ``id_dtype``. ``storage.partition_stream`` writes the same
    bytes chunk by chunk."""
    g = open_group(writer.file_url(_part_name(csr.part)), mode="w")
    write_array(g, "indptr", csr.indptr.astype(np.int64, copy=False))
    write_array(g, "indices", csr.indices.astype(id_dtype(num_nodes), copy=False), progress=progress)
    if edge_attr is not None:
        if edge_attr.ndim != 2 or edge_attr.shape[0] != csr.indices.shape[0]:
            raise ValueError(f"edge_attr of shape {edge_attr.shape} for part {csr.part}'s {csr.indices.shape[0]} "
                             "edges")
        write_array(g, "edge_attr", edge_attr, progress=progress)
        g.attrs["num_edge_features"] = int(edge_attr.shape[1])
    if edge_splits:
        group = g.create_group("edge_split")
        for name, pairs in edge_splits.items():
            write_array(group, name, pairs.astype(np.int64, copy=False))
    g.attrs.update(part_attrs(csr.part, csr.start_gid, csr.num_nodes, csr.num_edge_types,
                              int(csr.indices.shape[0]), num_nodes))
    write_link_arrays(g, edge_splits, edge_split_negatives, progress=progress)


def part_attrs(part: int, start_gid: int, part_nodes: int, num_edge_types: int, num_edges: int,
               num_nodes: int) -> dict[str, Any]:
    """A ``part-<p>.zarr``'s group attrs, in the order both writers give them (their JSON is byte-identical)."""
    return {"part": part, "start_gid": start_gid, "num_nodes": part_nodes, "num_edge_types": num_edge_types,
            "num_edges": num_edges, "id_dtype": str(id_dtype(num_nodes))}


def write_link_arrays(g: zarr.Group, edge_splits: dict[str, np.ndarray] | None,
                      edge_split_negatives: dict[str, np.ndarray] | None, *, progress: bool = False) -> None:
    """A part's ``edge_split`` sizes attr and ``edge_split_neg`` group (its ``edge_split`` group is written before
    its attrs), as both writers do."""
    if edge_splits:
        g.attrs["edge_split_sizes"] = {k: int(v.shape[1]) for k, v in edge_splits.items()}
    if edge_split_negatives:
        group = g.create_group("edge_split_neg")
        for name, neg in edge_split_negatives.items():
            write_array(group, name, neg.astype(np.int64, copy=False), progress=progress)
        g.attrs["edge_split_neg_shapes"] = {k: list(v.shape) for k, v in edge_split_negatives.items()}


def _read_part(url: str, native: bool = False) -> PartCSR:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe partition (no attrs); rerun the partition stage")
    return PartCSR(attr_int(attrs, "part", url), attr_int(attrs, "start_gid", url), read_array(g, "indptr"),
                   read_ids(g, "indices", native),
                   attr_int(attrs, "num_edge_types", url))


def concat_parts(parts: list[PartCSR]) -> tuple[np.ndarray, np.ndarray]:
    """The whole graph's incoming-edge CSR in gid order, ``(gid_indptr, gid_indices)``, from all its parts (in
    any order): each part's rows are its gid range, so the parts' CSRs follow each other with offset indptrs.
    Holds the whole graph in memory."""
    parts = sorted(parts, key=lambda c: c.part)
    offsets = np.cumsum([0] + [int(c.indptr[-1]) for c in parts])
    gid_indptr = np.concatenate([[0]] + [c.indptr[1:] + off for c, off in zip(parts, offsets)]).astype(np.int64)
    gid_indices = np.concatenate([c.indices for c in parts]) if parts else np.zeros(0, dtype=np.int64)
    return gid_indptr, gid_indices


class PartitionArtifact(ArtifactHandle):
    """The partition stage's artifact, read through its manifest."""

    STAGE = "partition"

    @cached_property
    def summary(self) -> PartitionSummary:
        return PartitionSummary.from_json(self.manifest.summary)

    @property
    def num_partitions(self) -> int:
        return int(self.summary.num_partitions)

    def bounds(self) -> np.ndarray:
        """int64 [P+1]: partition p owns gids ``[bounds[p], bounds[p+1])`` (reads only this array of the book)."""
        return read_array(open_group(self._url(_BOOK)), "bounds")

    @property
    def schema(self) -> GraphSchema:
        """The partitioned graph's node and edge types."""
        return GraphSchema.from_dict(self.summary.schema)

    def range_table(self) -> RangeTable:
        """Owner, node type and tlid of gids (reads only ``type_bounds``)."""
        return RangeTable(read_array(open_group(self._url(_BOOK)), "type_bounds"), len(self.schema.node_types))

    def book(self) -> PartitionBook:
        return _read_book(self._url(_BOOK))

    def csr(self, p: int, native: bool = False) -> PartCSR:
        """Partition p's incoming-edge CSR (rows: lids, indices: gids): ``indices`` widened to int64, or with
        ``native`` in its stored ``id_dtype`` (int32 below 2^31 nodes: what a rank holds, 4 B an edge)."""
        return _read_part(self._url(_part_name(p)), native)

    @property
    def link_edge_type(self) -> str | None:
        """The key of link prediction's split edge type, or None (a graph downloaded for node classification)."""
        return self.summary.link_edge_type

    def edge_split(self, p: int, split: str) -> np.ndarray:
        """int64 [2, E] (src, dst) gids of link prediction's ``split`` positives whose dst partition p owns."""
        if self.link_edge_type is None:
            raise ArtifactError(f"partition {self.manifest.key} has no edge splits (its graph was downloaded for "
                                f"node classification)")
        return read_ids(open_subgroup(open_group(self._url(_part_name(p))), "edge_split"), split)

    @property
    def link_eval(self) -> str | None:
        """How the fixed evaluation negatives are ranked, ``per-positive`` or ``shared`` (``storage.graph``), or
        None: the dataset fixes none (the train stage draws its own)."""
        return self.summary.link_eval

    def edge_split_negatives(self, p: int, split: str) -> np.ndarray:
        """Partition p's fixed evaluation negatives of ``split`` (valid, test) in gids, laid out by ``link_eval``
        (module docstring): per-positive int64 [E, K], row i for ``edge_split(p, split)[:, i]``; shared int64
        [2, E_neg] (src, dst), the pairs whose dst p owns (``np.concatenate(..., axis=1)`` over the parts: all)."""
        if self.link_eval is None:
            raise ArtifactError(f"partition {self.manifest.key} has no fixed evaluation negatives (only ogbl-* "
                                f"datasets have them); draw negatives in the train stage instead")
        return read_ids(open_subgroup(open_group(self._url(_part_name(p))), "edge_split_neg"), split)

    @property
    def num_edge_features(self) -> int:
        """D of the parts' ``edge_attr`` (0: the graph has no edge features)."""
        return int(self.summary.num_edge_features)

    def edge_attr(self, p: int) -> np.ndarray:
        """float32 [e_p, D]: the attributes of part p's edges, by elid (aligned with ``csr(p).indices``)."""
        if not self.num_edge_features:
            raise ArtifactError(f"partition {self.manifest.key} has no edge features (its graph has none)")
        return read_array(open_group(self._url(_part_name(p))), "edge_attr")

    def edge_bounds(self) -> np.ndarray:
        """int64 [P+1]: part p owns the egids ``[edge_bounds[p], edge_bounds[p+1])`` (module docstring), from the
        parts' edge counts (their attrs; no edge read)."""
        counts = [attr_int(dict(open_group(self._url(_part_name(p))).attrs), "num_edges", self._url(_part_name(p)))
                  for p in range(self.num_partitions)]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def in_degree(self) -> np.ndarray:
        """int64 [N]: the in-degree of every gid, from the parts' ``indptr`` arrays only (8 bytes a node, no edges
        read)."""
        r = self.schema.num_edge_types
        return np.concatenate([np.diff(read_array(open_group(self._url(_part_name(p))), "indptr")[::r])
                               for p in range(self.num_partitions)])

    def csr_arrays(self, p: int) -> tuple[zarr.Array, zarr.Array]:
        """Part p's ``(indptr, indices)`` Zarr arrays opened, not read, in their on-disk dtypes: for a stage that
        copies them block by block (``stages.hotness.whole_csr``) instead of holding a part as int64."""
        g = open_group(self._url(_part_name(p)))
        return open_array(g, "indptr"), open_array(g, "indices")
