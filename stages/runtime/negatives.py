"""Negative edges for link prediction ([6/7], docs/history.md): uniform draws and the real-edge check.

- ``NegativeDraws``: destinations drawn uniformly among all nodes of the target edge type's destination type,
  anywhere in the graph (their features come through the normal exchange), from the caller's generator, so a
  rank's negatives are a function of its seed. On a typed graph a type's gids are one range per partition, so a
  draw is a tgid (the type's nodes numbered part by part) mapped to its gid (``TypeIndex.tgid_to_gid``).
- ``EdgeMembership``: whether pairs ``src -> dst`` are edges of the (message-passing) graph, asked of each dst's
  owner, whose incoming rows are sorted by source: a batched binary search per row, no table built. Used to
  filter false negatives (a drawn pair that is a real edge).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.collectives import Owners, all_to_all, comm_device, route_to_owners
from stages.runtime.csr import LocalCSR
from stages.runtime.typed_rows import TypeIndex
from storage.schema import EdgeType, GraphSchema


class NegativeDraws:
    """Uniform destination gids of one node type (``node_type``; None: every node of a one-type graph)."""

    def __init__(self, num_nodes: int, *, index: TypeIndex | None = None, node_type: int | None = None) -> None:
        if (index is None) != (node_type is None):
            raise ValueError("a typed graph's negatives need both its TypeIndex and the destination node type")
        self.index, self.node_type = index, node_type
        if index is not None and node_type is not None:
            self.num_candidates = int(index.type_tgid_bounds[node_type][-1])
        else:
            self.num_candidates = int(num_nodes)
        if self.num_candidates < 1:
            raise ValueError("no node to draw negatives from")

    @classmethod
    def for_link(cls, schema: GraphSchema, link_edge_type: str, index: TypeIndex | None) -> NegativeDraws:
        """The destinations of link prediction's edge type (its key): every node of a one-type graph, else the
        nodes of its destination type (``index``: the graph's ``TypeIndex``, on the device the draws go to)."""
        if schema.is_homogeneous:
            return cls(schema.num_nodes)
        if index is None:
            raise ValueError("a typed graph's negatives need its TypeIndex")
        return cls(schema.num_nodes, index=index, node_type=schema.type_id(EdgeType.from_key(link_edge_type).dst))

    def draw(self, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """int64 gids of ``shape``: ``(n,)`` shared negatives, or ``(n, k)`` k per positive."""
        tgid = torch.randint(0, self.num_candidates, shape, generator=generator, device=generator.device)
        if self.index is None or self.node_type is None:
            return tgid
        # on the index's device (a CPU generator may feed a CUDA index): tgid_to_gid indexes its tables with tgid
        tgid = tgid.to(self.index.type_bounds.device)
        return self.index.tgid_to_gid(self.node_type, tgid.view(-1)).view(shape)


def has_local_edge(csr: LocalCSR, src_gid: Tensor, dst_lid: Tensor, edge_type: int = 0) -> Tensor:
    """bool: is ``src_gid[i] -> start_gid + dst_lid[i]`` a type-``edge_type`` edge of this CSR (rows sorted)?"""
    if csr.indices.numel() == 0:
        return torch.zeros_like(src_gid, dtype=torch.bool)
    row = dst_lid * csr.num_edge_types + edge_type
    lo, end = csr.indptr.index_select(0, row), csr.indptr.index_select(0, row + 1)
    hi = end.clone()
    last = int(csr.indices.numel()) - 1
    while bool((lo < hi).any()):   # the first entry >= src in each row: ~log2(max degree) rounds, all at once
        mid = torch.div(lo + hi, 2, rounding_mode="floor")
        below = csr.indices.index_select(0, mid.clamp(max=last)) < src_gid
        active = lo < hi
        lo = torch.where(active & below, mid + 1, lo)
        hi = torch.where(active & ~below, mid, hi)
    return (lo < end) & (csr.indices.index_select(0, lo.clamp(max=last)) == src_gid)


class EdgeMembership:
    """``contains(src_gid, dst_gid)`` over a graph split by ``bounds``: each pair asked of its dst's owner. A
    collective on several ranks (4 all-to-alls: counts, dsts, srcs, answers); every rank must call it alike."""

    def __init__(self, csr: LocalCSR, bounds: np.ndarray | list[int], edge_type: int = 0,
                 group: dist.ProcessGroup | None = None) -> None:
        self.csr, self.edge_type, self.group = csr, edge_type, group
        self.owners = Owners.of(bounds, group, csr.indptr.device)
        self.device = comm_device(group) if self.owners.distributed else torch.device("cpu")

    def contains(self, src_gid: Tensor, dst_gid: Tensor) -> Tensor:
        src_gid, dst_gid = src_gid.reshape(-1), dst_gid.reshape(-1)
        owners = self.owners
        wire = torch.int32 if int(owners.bounds[-1]) < 2**31 else torch.long
        req = route_to_owners(dst_gid, owners.bounds, owners.rank, owners.world_size, self.group, self.device, wire,
                              ("pair destinations", "membership check"))
        out = torch.zeros(dst_gid.numel(), dtype=torch.bool, device=dst_gid.device)
        lo = self.csr.start_gid
        local = req.local_pos
        out[local] = has_local_edge(self.csr, src_gid[local], dst_gid[local] - lo, self.edge_type)
        if owners.world_size == 1:
            return out
        got_src = all_to_all(src_gid.index_select(0, req.req_pos), req.req_split, req.got_split, self.group,
                             self.device, wire)
        answers = has_local_edge(self.csr, got_src, req.got_id - lo, self.edge_type).to(torch.uint8)
        back = all_to_all(answers, req.got_split, req.req_split, self.group, self.device)
        out[req.req_pos] = back.to(torch.bool)
        return out
