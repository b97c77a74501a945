"""The whole graph's incoming-edge CSR in gid order, for the hotness stage's sampler, assembled from the partition's
part CSRs one part at a time: in anonymous memory when that fits the stage's memory budget, else in spill files on
the artifact root's disk mapped into the sampler (page cache, which the budget does not count: ``stages.memory``).

The concatenation is the parts' CSRs one after another, each ``indptr`` offset by the edges before its part (as
``storage.partition.concat_parts`` builds it, without that function's list of every part plus the concatenated copy:
two int64 copies of every edge, 6.4 GB at 400 M edges). ``indices`` are stored int32 while every gid fits: half
the bytes, and the sampler widens only the sampled entries (``LocalCSR.gids``), so the batches are the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from stages.memory import MemoryBudget, gib
from storage.partition import PartitionArtifact
from storage.zarr_io import read_into, read_rows

# The stage's anonymous memory per node at its peak (one partition being planned), besides indptr's 8 bytes per
# (node, edge type) row: in-degree, the degree ranking and the sampler's node map (8 + 8 + 4) live throughout, the
# fit and held-out counts and the hotness ranking (3 x 8) per part, lexsort's keys or the hit-rate curve's gathered
# counts and running sum (3 x 8) transiently: 68 B. Measured: 154 MB above the anonymous memory before the CSR at
# 1 M nodes (avg degree 20, 4 parts, fanouts 15,10,5, batches of 1024, mapped path), 146 B a node besides indptr;
# the rest is the plan's ranked arrays and sampling's per-batch tensors. The measured figure is the minimum, so that
# a budget it accepts holds (at 14 M nodes: 2.2 GB). A typed graph adds each gid's type and row width (2 x 8).
FIXED_BYTES_PER_NODE = 146
TYPED_BYTES_PER_NODE = 16
_COPY_ROWS = 8 << 20   # edges copied per step into the concatenation (rounded to whole Zarr chunks): 32-64 MiB


@dataclass(frozen=True)
class CsrLayout:
    """What the assembly will hold, from the manifest and the parts' attrs alone (no edge read)."""

    num_nodes: int
    num_edge_types: int
    typed: bool
    edge_bounds: np.ndarray   # int64 [P+1]: part p's edges are [edge_bounds[p], edge_bounds[p+1]) of the whole

    @classmethod
    def of(cls, partition: PartitionArtifact) -> CsrLayout:
        schema = partition.schema
        return cls(schema.num_nodes, schema.num_edge_types, not schema.is_homogeneous, partition.edge_bounds())

    @property
    def num_edges(self) -> int:
        return int(self.edge_bounds[-1])

    @property
    def index_dtype(self) -> np.dtype:
        return np.dtype(np.int32 if self.num_nodes < 2**31 else np.int64)

    def minimum(self) -> int:
        """Bytes the stage holds whatever the path: its O(N) arrays (indptr over the (node, edge type) rows too)."""
        per_node = FIXED_BYTES_PER_NODE + (TYPED_BYTES_PER_NODE if self.typed else 0) + 8 * self.num_edge_types
        return self.num_nodes * per_node + 8

    def in_memory(self) -> int:
        """Bytes of the in-memory path: the minimum, every edge's index, and one part's int64 edges as read."""
        largest = int(np.diff(self.edge_bounds).max(initial=0))
        return self.minimum() + self.num_edges * self.index_dtype.itemsize + 8 * largest

    def describe_minimum(self) -> str:
        return (f"the O(N) arrays of {self.num_nodes:,} nodes ({gib(self.minimum())}: in-degree, rankings, request "
                f"counts, CSR row pointers)")


def choose_mapped(layout: CsrLayout, budget: MemoryBudget, base_anon_bytes: int) -> bool:
    """Whether to map the CSR from spill files: only when the in-memory one would not fit beside what the process
    already holds (``base_anon_bytes``: the interpreter, torch); the outputs are the same either way."""
    return not budget.fits(base_anon_bytes + layout.in_memory())


def assemble(partition: PartitionArtifact, layout: CsrLayout, directory: str | None) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr int64 [N*R+1], indices [E])`` of the whole graph in gid order; ``directory``: a scratch directory
    to map ``indices`` from (None: anonymous memory). Parts are read one at a time."""
    indptr = np.empty(layout.num_nodes * layout.num_edge_types + 1, dtype=np.int64)
    indptr[0] = 0
    dtype, num_edges = layout.index_dtype, layout.num_edges
    path = os.path.join(directory, "indices.npy") if directory is not None else None
    if path is None or num_edges == 0:   # numpy cannot map a file of no data
        indices: np.ndarray = np.empty(num_edges, dtype=dtype)
    else:
        indices = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(num_edges,))
    row = 0
    for p in range(len(layout.edge_bounds) - 1):
        zarr_indptr, zarr_indices = partition.csr_arrays(p)
        part_indptr = read_into(zarr_indptr)   # O(n_p): its rows are the minimum's
        lo = int(layout.edge_bounds[p])
        rows = part_indptr.shape[0] - 1
        np.add(part_indptr[1:], lo, out=indptr[row + 1:row + 1 + rows])
        # straight from Zarr into the concatenation, whole source chunks at a time: no int64 copy of the part, no
        # spill of it (the mapped path wrote each part twice before, ~1.5x the int64 edges)
        chunk = max(1, int(zarr_indices.chunks[0]))
        step = max(chunk, _COPY_ROWS // chunk * chunk)
        for a in range(0, int(zarr_indices.shape[0]), step):
            block = read_rows(zarr_indices, a, a + step)
            indices[lo + a:lo + a + block.shape[0]] = block
        row += rows
    if row != indptr.shape[0] - 1:
        raise ValueError(f"the parts hold {row} CSR rows, the graph {indptr.shape[0] - 1}")
    if path is None or num_edges == 0:
        return indptr, indices
    assert isinstance(indices, np.memmap)
    indices.flush()
    del indices
    # copy-on-write: writable, so torch.from_numpy does not warn about a read-only array; nothing writes to it
    return indptr, np.load(path, mmap_mode="c")
