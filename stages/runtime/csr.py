"""A partition's CSR of incoming edges as tensors on one device: what the samplers (``stages.runtime.sampling``)
and layer-wise inference read.

ID spaces: ``gid`` global, ``lid = gid - start_gid`` local; ``elid`` a position in ``indices``, ``egid = start_egid
+ elid`` the edge's global id (``storage.partition``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stages.runtime.sampling.weighted import weight_running_sum
from stages.runtime.uva import UvaUnavailableError, device_view
from storage.partition import PartCSR

__all__ = ["LocalCSR"]


@dataclass
class LocalCSR:
    """Incoming-edge CSR of the gids ``[start_gid, start_gid + num_nodes)`` as tensors on one device.

    Rows are (node, edge type) pairs, row ``lid * R + e`` (``R = num_edge_types``, storage/graph.py):
    ``indices[indptr[lid*R + e]:indptr[lid*R + e + 1]]`` are the gids of the sources of the type-e edges into
    ``start_gid + lid``. With R = 1 a row is a node.
    """

    start_gid: int
    indptr: Tensor   # int64 [num_nodes * R + 1], over (lid, edge type) rows
    # int64 or int32 [num_edges], gids: kept as given (an int32 CSR of 400 M edges is 1.6 GB where widening would
    # copy 3.2 GB); read a sampled edge's gid through ``gids`` (always int64), never ``indices[...]`` directly
    indices: Tensor
    num_edge_types: int = 1
    start_egid: int = 0   # the egid of elid 0: the edges of the parts before this one
    # weighted sampling (``stages.runtime.sampling.weighted``): float [num_edges] by elid, non-negative, and its
    # running sum; None: the uniform kernel
    edge_weight: Tensor | None = None
    weight_sum: Tensor | None = None

    def with_edge_weight(self, edge_weight: Tensor) -> LocalCSR:
        """This CSR sampling in-edges in proportion to ``edge_weight`` (float [num_edges] by elid, finite and
        non-negative: ValueError otherwise)."""
        weight = edge_weight.to(device=self.device, dtype=torch.float64)
        if weight.shape != self.indices.shape or not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
            raise ValueError(f"edge weights must be {self.indices.numel()} finite values >= 0 (one per edge)")
        return dataclasses.replace(self, edge_weight=weight, weight_sum=weight_running_sum(weight))

    @classmethod
    def from_numpy(cls, indptr: np.ndarray, indices: np.ndarray, start_gid: int = 0,
                   device: torch.device | str = "cpu", num_edge_types: int = 1, start_egid: int = 0) -> LocalCSR:
        """``indices`` int32 stays int32 (other integer dtypes become int64); from_numpy shares memory on CPU, so
        a 1 GB ``indices`` (or a memory map of one, opened writable, e.g. copy-on-write: torch warns about a
        read-only array) is not copied."""
        if (indptr.shape[0] - 1) % num_edge_types:
            raise ValueError(f"{indptr.shape[0] - 1} CSR rows are not a whole number of nodes of "
                             f"{num_edge_types} edge types")
        index_dtype = np.int32 if indices.dtype == np.int32 else np.int64
        return cls(int(start_gid), torch.from_numpy(np.ascontiguousarray(indptr, dtype=np.int64)).to(device),
                   torch.from_numpy(np.ascontiguousarray(indices, dtype=index_dtype)).to(device), int(num_edge_types),
                   int(start_egid))

    @classmethod
    def from_part(cls, part: PartCSR, device: torch.device | str = "cpu", start_egid: int = 0) -> LocalCSR:
        """``start_egid``: ``PartitionArtifact.edge_bounds()[part.part]`` (needed for batches with ``e_id``)."""
        return cls.from_numpy(part.indptr, part.indices, part.start_gid, device, part.num_edge_types, start_egid)

    def to_device(self, device: torch.device | str) -> LocalCSR:
        """This CSR with every tensor copied to ``device``."""
        return self._mapped(lambda t: t.to(device))

    def pinned_on(self, device: torch.device) -> LocalCSR:
        """This CSR (on the CPU) in page-locked host memory, its tensors device views of it (``stages.runtime.uva``):
        a CUDA device samples it in place over PCIe, no device memory held. Raises ``UvaUnavailableError`` where
        the device cannot (no CUDA, or the driver refuses the mapping). The copy into page-locked memory goes
        through torch's pinned allocator, which rounds each block up to a power of two (as the feature rows'
        pinning does): up to twice a tensor's bytes of host RAM; registering the memory in place
        (``cudaHostRegister``) would avoid it."""
        if self.device.type != "cpu":
            raise ValueError(f"pinned_on pins a CSR in host memory; this one is on {self.device}")
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():   # pin_memory itself needs a CUDA driver
            raise UvaUnavailableError(f"a CSR sampled in place needs a CUDA device, not {device}")
        return self._mapped(lambda t: device_view(t.pin_memory(), device))

    @property
    def nbytes(self) -> int:
        """What its tensors hold, in bytes (what a device would hold of it)."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def _tensors(self) -> dict[str, Tensor]:
        return {f.name: v for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), Tensor)}

    def _mapped(self, move: Callable[[Tensor], Tensor]) -> LocalCSR:
        moved: dict[str, Any] = {name: move(t) for name, t in self._tensors().items()}
        return dataclasses.replace(self, **moved)

    def gids(self, edge_idx: Tensor) -> Tensor:
        """int64: the source gids of the edges at ``edge_idx`` (elids), whatever ``indices``' dtype; widening only
        the batch's few entries is what lets ``indices`` stay int32."""
        return self.indices.index_select(0, edge_idx).to(torch.long)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1) // self.num_edge_types

    @property
    def end_gid(self) -> int:
        return self.start_gid + self.num_nodes

    @property
    def device(self) -> torch.device:
        return self.indptr.device
