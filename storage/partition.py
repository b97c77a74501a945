"""The partition artifact format (``book.zarr`` + ``part-<p>.zarr``), written by the partition stage.

ID spaces (DESIGN.md §3):

- ``orig``: dataset ids. ``gid``: global ids after relabelling, so that partition p owns the contiguous range
  ``[bounds[p], bounds[p+1])``. ``lid = gid - bounds[p]``: local to partition p.
- ``book.zarr``: ``bounds`` int64 [P+1], ``orig_of_gid`` int64 [N], ``gid_of_orig`` int64 [N].
- ``part-<p>.zarr``: ``indptr`` int64 [n_p+1] over lids, ``indices`` int64 [e_p] in **gids**: the CSR of incoming
  edges of the nodes p owns. Concatenating the parts' CSRs (offsetting indptr) gives the whole graph's CSR in
  gid order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.errors import ArtifactError
from storage.zarr_io import open_group, read_array, write_array

BOOK = "book.zarr"


def part_name(p: int) -> str:
    return f"part-{p}.zarr"


@dataclass
class PartitionBook:
    """Who owns which gid; the only id mapping a worker needs at run time is ``bounds``."""

    bounds: np.ndarray       # int64 [P+1]
    orig_of_gid: np.ndarray  # int64 [N]
    gid_of_orig: np.ndarray  # int64 [N]

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


@dataclass
class PartCSR:
    """Partition p's incoming-edge CSR: rows are lids, ``indices`` are gids."""

    part: int
    start_gid: int
    indptr: np.ndarray   # int64 [n_p+1], over lids
    indices: np.ndarray  # int64 [e_p], gids

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)


def write_book(url: str, book: PartitionBook, attrs: dict[str, Any]) -> None:
    g = open_group(url, mode="w")
    write_array(g, "bounds", book.bounds.astype(np.int64, copy=False))
    write_array(g, "orig_of_gid", book.orig_of_gid.astype(np.int64, copy=False))
    write_array(g, "gid_of_orig", book.gid_of_orig.astype(np.int64, copy=False))
    g.attrs.update(attrs)


def read_book(url: str) -> PartitionBook:
    g = open_group(url)
    return PartitionBook(read_array(g, "bounds"), read_array(g, "orig_of_gid"), read_array(g, "gid_of_orig"))


def read_book_attrs(url: str) -> dict[str, Any]:
    return dict(open_group(url).attrs)


def write_part(url: str, csr: PartCSR, *, progress: bool = False) -> None:
    g = open_group(url, mode="w")
    write_array(g, "indptr", csr.indptr.astype(np.int64, copy=False))
    write_array(g, "indices", csr.indices.astype(np.int64, copy=False), progress=progress)
    g.attrs.update({"part": csr.part, "start_gid": csr.start_gid, "num_nodes": csr.num_nodes,
                    "num_edges": int(csr.indices.shape[0])})


def read_part(url: str) -> PartCSR:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe partition (no attrs); rerun the partition stage")
    return PartCSR(int(attrs["part"]), int(attrs["start_gid"]), read_array(g, "indptr"), read_array(g, "indices"))
