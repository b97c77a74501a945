"""Layer-wise inference from whole layer matrices: a rank's own rows, then its halo (docs/design.md §6).

A layer of an offset-capable model (``supports_offset_targets``: the built-in GraphSAGE and GCN) reads its sources
straight from one matrix per layer, ``[n_p + H, C]``::

    rows [0, n_p)          the rank's own nodes, in lid order (this layer's input, computed by the previous layer)
    rows [n_p, n_p + H)    the halo: the distinct in-neighbours owned by other ranks (``Halo.gid``, sorted), fetched
                           from their owners once per layer, after the previous layer is complete everywhere

A chunk of own lids ``[a, b)`` is then one CSR product over that matrix whose targets are the rows ``[a, b)``
(``Block.dst_start`` = a): no per-chunk gather of the sources' rows into a compact block and no per-chunk exchange.
At 300 k nodes x 50 in-edges (1 thread) the per-chunk gather path spent 5.2 of 12.7 s copying rows and 0.6 s in
``unique``; the exchange fetched a remote row once per chunk that needed it (14.4 GiB at products scale, where the
halo is fetched once per layer here). Chunks carry no collective, so ranks need not run equal chunk counts; the
halo is fetched in pieces of at most ``piece_rows`` rows (an equal piece count on every rank), which bounds the
exchange's buffers.

Memory per rank: the layer matrices M_l = (n_p + H) * C_l * 4 bytes, two at a time (the input and the output
being computed), and at layer 0 the features x as well while their rows are copied: a peak of
max(x + M_0, M_0 + M_1), plus a chunk's CSR and its (b - a) * C outputs and one halo piece on the wire (at most
``layerwise.HALO_PIECE_BYTES``). A matrix that does not fit the rank's host memory budget beside what the rank
already holds is a memory-mapped file (``stages.infer.matrices``): page cache, not anonymous memory. H can approach
N - n_p when the partition cuts many edges: ~1 M for n_p = 1.2 M on the products-scale synthetic graph (from the
4.7 GiB exchanged over its 3 layers). Features kept in Zarr (past the budget) are not held: layer 0's matrix reads
the rank's rows in row pieces, and the peers' halo requests (sorted gids) read each Zarr chunk about once. Sampled
inference (``fanouts``) fetches the whole halo too: exact inference's bytes, where the per-chunk gather fetched
only the sampled sources (4.7 vs 3.3 GiB at products scale, in half the time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from stages.infer.matrices import MatrixSpace
from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import InMemoryFeatureStore


@dataclass(frozen=True)
class Halo:
    """The distinct other ranks' in-neighbours of ``[lo, lo + n)`` (``gid``, sorted) and the column of any source
    gid in the layer matrix ``[own rows | halo rows]``."""

    lo: int
    n: int
    gid: Tensor

    @classmethod
    def of(cls, csr: LocalCSR) -> Halo:
        """Every in-neighbour outside the rank (exact inference needs them all; sampled draws among them)."""
        src_gid = csr.indices
        remote_gid = src_gid[(src_gid < csr.start_gid) | (src_gid >= csr.end_gid)]
        return cls(csr.start_gid, csr.num_nodes, torch.unique(remote_gid).to(torch.long))   # H gids: int64

    @property
    def size(self) -> int:
        return int(self.gid.numel())

    @property
    def rows(self) -> int:
        """Rows of a layer matrix: own then halo."""
        return self.n + self.size

    def columns(self, src_gid: Tensor) -> Tensor:
        """The layer-matrix rows of ``src_gid`` (own: ``lid``; others: ``n + position in gid``)."""
        own = (src_gid >= self.lo) & (src_gid < self.lo + self.n)
        return torch.where(own, src_gid - self.lo, self.n + torch.searchsorted(self.gid, src_gid))

    def fill(self, matrix: Tensor, source: DistFeatures, piece_rows: int) -> int:
        """``matrix[n:] = rows of gid`` from their owners' ``source``, in pieces of ``piece_rows``. Collective (every
        rank, the same piece count). Returns the bytes received."""
        source.fetch_rows_into(self.gid, matrix[self.n:], piece_rows)
        return self.size * source.store.row_bytes

    def own_source(self, matrix: Tensor, bounds: np.ndarray) -> DistFeatures:
        """The peers' view of this rank's rows of ``matrix`` (they fetch their halos from it)."""
        return DistFeatures(InMemoryFeatureStore(matrix[:self.n]), bounds)


def layer0_matrix(features: DistFeatures, halo: Halo, piece_rows: int, space: MatrixSpace | None = None
                  ) -> tuple[Tensor, int]:
    """Layer 0's input ``[n + H, F]`` as float32 (in ``space``: RAM or memory-mapped): the own rows read from the
    rank's store in pieces (a Zarr store's in row order, each chunk decoded once), the halo from their owners.
    Collective. Returns it and the bytes received."""
    matrix = (space or MatrixSpace()).empty(halo.rows, features.num_features)
    for start in range(0, halo.n, piece_rows):
        stop = min(start + piece_rows, halo.n)
        matrix[start:stop] = features.decode(features.store.gather(torch.arange(start, stop, dtype=torch.long)))
    return matrix, halo.fill(matrix, features, piece_rows)


def extended_degrees(degrees: DistFeatures, halo: Halo) -> Tensor:
    """In-degree + 1 of every layer-matrix row (GCN's normalisation). Collective."""
    gid = torch.cat([torch.arange(halo.lo, halo.lo + halo.n, dtype=torch.long), halo.gid])
    return degrees.fetch_rows(gid).view(-1).to(torch.float32)


# ---- a GPU rank's layer steps (stages.infer.layerwise): where they read the matrix's rows ------------------------

def placement(matrix: Tensor, halo: Halo, width_out: int, chunk_edges: int, budget: int) -> str:
    """``device`` (the whole matrix copied to the device once, the outputs gathered there and copied back once)
    when the matrix, the layer's outputs and a chunk's temporaries fit ``budget`` bytes, else ``chunks`` (each
    chunk's rows gathered on the host and copied over: ``chunk_rows``)."""
    needed = _resident_bytes(matrix, halo, width_out) + chunk_edges * _chunk_bytes_per_edge(matrix, width_out)
    return "device" if needed <= budget else "chunks"


def device_chunk_edges(matrix: Tensor, halo: Halo, width_out: int, chunk_edges: int, budget: int) -> int:
    """A ``device``-placed layer's chunk bound: the largest whose estimated temporaries fit half of what
    ``budget`` leaves beside the matrix and the outputs (the other half: what the estimate leaves out, the
    previous chunk's tensors still alive while the next one's are made), never below ``chunk_edges``. Each chunk
    costs launches and host synchronisations whatever its size: on an H200, products' 3 layers in 455 chunks of
    2^18 each took 6.8 s, where their products and GEMMs need well under one (benchmarks/RESULTS.md, session 31)."""
    spare = budget - _resident_bytes(matrix, halo, width_out)
    return max(chunk_edges, spare // 2 // _chunk_bytes_per_edge(matrix, width_out))


def _resident_bytes(matrix: Tensor, halo: Halo, width_out: int) -> int:
    """A device-placed layer's matrix and outputs."""
    return matrix.numel() * matrix.element_size() + halo.n * width_out * matrix.element_size()


def _chunk_bytes_per_edge(matrix: Tensor, width_out: int) -> int:
    # a chunk: its aggregated and output rows (3 values a column: the product, the linear map, a temporary) and its
    # CSR (~48 B an edge: BatchGraph's row pointers, columns, values, the sort); rows counted per edge, as a chunk
    # of E edges may hold E targets
    return (matrix.shape[1] + width_out) * 3 * matrix.element_size() + 48


def chunk_rows(matrix: Tensor, src_pos: Tensor, a: int, b: int, deg: Tensor | None, device: torch.device
               ) -> tuple[Tensor, Tensor, Tensor | None]:
    """A chunk's sources when the matrix stays on the host: the targets' rows ``[a, b)`` then the chunk's distinct
    other source rows, copied to ``device``; the edges' source positions among them (a target that is also a
    source keeps its target position, as on the whole matrix, where a self loop's column is its row); their
    degrees."""
    inside = (src_pos >= a) & (src_pos < b)
    others = torch.unique(src_pos[~inside])   # sorted matrix rows outside the chunk
    sub = torch.cat([torch.arange(a, b, dtype=torch.long), others])
    local_pos = torch.where(inside, src_pos - a, (b - a) + torch.searchsorted(others, src_pos))
    rows = matrix.index_select(0, sub).to(device)
    return rows, local_pos, None if deg is None else deg.index_select(0, sub.to(deg.device))

