"""Multi-hop uniform sampling straight into a batch of static shape, with no host read: capturable as one CUDA graph.

The eager sampler (``stages.runtime.sampling.sampler``) sizes every tensor by what it drew: each hop reads its edge
total and its count of new nodes back to the host, which on a GPU stops the producer thread until the device has
caught up (6 reads a products batch; the thread set the pace of a 1-GPU epoch on the H200,
``benchmarks/RESULTS.md``). Here every size comes from the ``StaticShape`` (the batch size and the fanouts alone)
and every count stays on the device, so a whole batch is a fixed sequence of kernels on fixed buffers:
``stages.train.rank.graphed`` captures it once and replays it per batch.

Per hop, for the frontier's ``R`` slots (level h's real capacity; its unfilled ones are fake) and fanout ``k``:

- an ``[R, k]`` grid of edge slots: slot ``(r, j)`` is real when ``j < count[r]`` (``min(deg, k)``; with replacement
  ``k`` when ``deg > 0``), a fake frontier slot having degree 0;
- its offsets: ``j`` in a row of ``deg <= k`` (every neighbour, in CSR order), Floyd's j-th pick in a row of
  ``deg > k`` (``uniform.floyd_offsets``, drawn for every row and kept where needed), ``floor(u * deg)`` with
  replacement: the eager kernel's law, slot for slot in the same order;
- the node map of ``relabel.DenseNodeMap`` (first occurrence by the lowest candidate index, an ``amin``), over every
  slot, a fake one writing only to spare table entries; the new nodes' positions are a running sum, not a compaction;
- the real edges packed to the front of the hop's edge range by a running sum over the real slots, in slot order
  (grouped by target); the rest keeps the shape's fake edges, so the hop's targets stay non-decreasing.

The batch is the padded layout of ``stages.train.rank.static_batch`` (each level's real nodes, then its fake ones;
each hop's real edges, then fake ones), built directly: with fanouts at least every degree (no draw), it equals the
padded eager batch exactly (tested). With draws the edges are another draw of the same law, since the eager kernel
draws Floyd's numbers for its subset rows only: reproducible for the same settings, not the eager run's samples.

ID spaces: ``gid`` global (a lone rank's CSR holds the whole graph, so ``lid == gid``); ``*_pos`` positions in the
padded batch; a slot's gid is ``num_nodes`` or more (a spare table entry) while it is fake, and its ``n_id`` is 0
then, a valid row that no real node reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling import (
    uniform as eager,  # its kernels through the module: a benchmark's patch applies here too
)
from stages.runtime.sampling.relabel import SENTINEL
from stages.runtime.sampling.static_shape import StaticShape

__all__ = ["StaticBatch", "StaticSampler", "why_not_static"]


@dataclass
class StaticBatch:
    """One batch in the static shape. ``n_id`` [num_nodes] gids (0 at fake slots), ``edge_index`` [2, num_edges]
    padded positions; 0-dim int64 counts on the device: ``real_nodes``, ``real_edges``, and per level
    ``level_nodes`` [levels] (the seeds, then each hop's new nodes). Tensors of the sampler's buffers, which the
    next batch overwrites: a caller keeping them across batches clones them."""

    n_id: Tensor
    edge_index: Tensor
    real_nodes: Tensor
    real_edges: Tensor
    level_nodes: Tensor


def why_not_static(csr: LocalCSR, fanouts: Sequence[object], num_nodes: int) -> str | None:
    """None when ``StaticSampler`` can sample ``csr`` with ``fanouts``, else why not (a report's words)."""
    if csr.start_gid != 0 or csr.num_nodes != num_nodes:
        return "the rank's CSR is one partition of several"
    if csr.edge_weight is not None:
        return "edge-weighted sampling"
    if csr.indices.numel() == 0:
        return "a graph without edges"
    if csr.num_edge_types != 1:
        return "several edge types"
    if any(not isinstance(f, int) or f <= 0 for f in fanouts):
        return "fanout -1 or per edge type (no static bound)"
    if (num_nodes + SPARE) * 4 > _TABLE_MAX_BYTES:
        return f"its node table of {num_nodes + SPARE} int32 entries is over {_TABLE_MAX_BYTES >> 30} GiB"
    return None


_TABLE_MAX_BYTES = 1 << 30   # relabel's dense map's limit: 268 M nodes
SPARE = 1024   # spare entries a fake slot's writes spread over, as relabel's once were (RESULTS.md, [4/5] H200)


class StaticSampler:
    """``sample(seed_gid, num_seeds)`` -> ``StaticBatch`` (module docstring) on ``csr``'s device, drawing from
    ``generator``. Owns its buffers (the node table: 4 bytes a node; the batch's slots and edges): one per producer.
    """

    def __init__(self, csr: LocalCSR, fanouts: Sequence[int], shape: StaticShape, *, replace: bool = False,
                 generator: torch.Generator | None = None) -> None:
        why = why_not_static(csr, fanouts, csr.num_nodes)
        if why is not None:
            raise ValueError(f"the static sampler cannot sample this graph: {why}")
        if len(shape.edges) != len(fanouts):
            raise ValueError(f"a shape of {len(shape.edges)} hops for {len(fanouts)} fanouts")
        self.csr, self.fanouts, self.shape = csr, [int(f) for f in fanouts], shape
        self.replace, self.generator = bool(replace), generator
        device = self.device = csr.device
        n = self.num_nodes = csr.num_nodes
        self.level_start = [0, *itertools.accumulate(shape.nodes)]
        self.capacity = [p - f for p, f in zip(shape.nodes, shape.fake)]   # each level's real slots at most
        for h, k in enumerate(self.fanouts):
            if shape.edges[h] != k * self.capacity[h]:
                raise ValueError(f"hop {h + 1}'s {shape.edges[h]} edge slots are not {k} per frontier slot")
            if self.capacity[h + 1] < min(k * self.capacity[h], n):   # a hop's new nodes would spill over
                raise ValueError(f"level {h + 1}'s {self.capacity[h + 1]} real slots cannot hold the up to "
                                 f"{min(k * self.capacity[h], n)} new nodes of hop {h + 1} on {n} nodes")
        self.edge_start = [0, *itertools.accumulate(shape.edges)]
        # What a fake slot writes goes to one of SPARE spare entries, chosen by its position: all on one address,
        # a GPU would queue a products batch's ~300 k writes there (relabel.DenseNodeMap spreads its own likewise).
        # The node table: n entries, then the spares (a fake slot's gid: n + its position % SPARE, so ">= n" is
        # "fake"); each padded slot's gid, then spare slots for the candidates that are not new; the edges, then
        # spare columns for the fake edge slots. What a batch wrote is reset by the next one.
        self.table = torch.full((n + SPARE,), SENTINEL, dtype=torch.int32, device=device)
        self.fake_gid = n + torch.arange(shape.num_nodes + SPARE, device=device) % SPARE
        self.slot_gid = self.fake_gid.clone()
        self.fake_edges = shape.fake_edge_index(device)
        self.edges = torch.empty((2, shape.num_edges + SPARE), dtype=torch.long, device=device)
        self.seed_pos = torch.arange(self.capacity[0], dtype=torch.int32, device=device)
        self.hops = [_HopConst.make(h, k, self, device) for h, k in enumerate(self.fanouts)]

    def sample(self, seed_gid: Tensor, num_seeds: Tensor) -> StaticBatch:
        """A batch around the first ``num_seeds`` (0-dim int64 on the device) of ``seed_gid`` ([batch size] int64
        gids, unique and in range: the loader checks its splits once; the rest of the buffer is ignored)."""
        n, shape = self.num_nodes, self.shape
        table, slot_gid = self.table, self.slot_gid
        table.index_fill_(0, slot_gid, SENTINEL)   # forget the previous batch (its fake slots: the spares)
        slot_gid.copy_(self.fake_gid)
        self.edges[:, :shape.num_edges].copy_(self.fake_edges)
        seed_gid = torch.where(self.seed_pos < num_seeds, seed_gid, self.fake_gid[:self.capacity[0]])
        slot_gid[:self.capacity[0]].copy_(seed_gid)
        table.scatter_(0, seed_gid, self.seed_pos)
        level_nodes, hop_edges = [num_seeds.reshape(1)], []
        for hop in self.hops:
            num_new, num_edges = self._hop(hop)
            level_nodes.append(num_new.reshape(1))
            hop_edges.append(num_edges.reshape(1))
        levels = torch.cat(level_nodes)
        n_id = slot_gid[:shape.num_nodes]
        return StaticBatch(n_id=torch.where(n_id < n, n_id, 0), edge_index=self.edges[:, :shape.num_edges],
                           real_nodes=levels.sum(), real_edges=torch.cat(hop_edges).sum(), level_nodes=levels)

    def _hop(self, hop: _HopConst) -> tuple[Tensor, Tensor]:
        """Hop h + 1 from level h's slots into level h + 1's and the hop's edge range: (new nodes, real edges)."""
        n, csr, k = self.num_nodes, self.csr, hop.fanout
        frontier = self.slot_gid[hop.frontier]
        lid = frontier.clamp(max=n - 1)   # a fake slot (gid >= n) reads a real row, then has degree 0
        row_start = csr.indptr.index_select(0, lid)
        deg = torch.where(frontier < n, csr.indptr[1:].index_select(0, lid) - row_start, 0)
        steps = hop.steps
        real = steps < (torch.where(deg > 0, k, 0) if self.replace else deg.clamp(max=k)).unsqueeze(1)   # [R, k]
        if self.replace:
            rand = torch.rand((deg.numel(), k), dtype=torch.float64, device=self.device, generator=self.generator)
            offset = eager.uniform_below(deg.unsqueeze(1), rand)
        else:   # Floyd's picks for every row (as if each had more than k), kept where it has
            picks = eager.floyd_offsets(deg.clamp(min=k + 1), k, self.generator).t()
            offset = torch.where((deg > k).unsqueeze(1), picks, steps)
        edge_idx = torch.where(real, row_start.unsqueeze(1) + offset, 0).view(-1)
        real = real.view(-1)
        cand = torch.where(real, csr.gids(edge_idx), hop.spare_gid)      # a fake slot: a spare entry
        num_new, cand_pos = self._add_nodes(hop, cand, real)
        # the real edges to the front of the hop's range, in slot order; a fake slot writes a spare column
        packed = torch.cumsum(real, 0)
        col = torch.where(real, packed - 1 + self.edge_start[hop.index], hop.spare_col)
        self.edges[0].scatter_(0, col, cand_pos.long())
        self.edges[1].scatter_(0, col, hop.target_pos)
        return num_new, packed[-1]

    def _add_nodes(self, hop: _HopConst, cand: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        """``relabel.DenseNodeMap.add`` on static sizes: level h + 1 takes the new gids among ``cand`` in first
        occurrence order; returns their count and each candidate's padded position (a fake one's: meaningless)."""
        table, cand_idx = self.table, hop.cand_idx
        is_new = real & (table.index_select(0, cand) == SENTINEL)
        table.scatter_reduce_(0, cand, torch.where(is_new, cand_idx, SENTINEL), reduce="amin")
        is_first = is_new & (table.index_select(0, cand) == cand_idx)
        rank = torch.cumsum(is_first, 0)
        pos = rank - 1 + self.level_start[hop.index + 1]
        table.scatter_(0, torch.where(is_first, cand, hop.spare_gid), pos.to(torch.int32))
        self.slot_gid.scatter_(0, torch.where(is_first, pos, hop.spare_slot), cand)
        return rank[-1], table.index_select(0, cand)


@dataclass(frozen=True)
class _HopConst:
    """Hop ``index + 1``'s fixed tensors: ``arange(fanout)``; per edge slot its target (its frontier slot's padded
    position, ``fanout`` slots a row), its candidate index, and the spare gid, slot and edge column it writes when
    it is fake (or, for the slot, not new)."""

    index: int
    fanout: int
    frontier: slice
    steps: Tensor
    target_pos: Tensor
    cand_idx: Tensor
    spare_gid: Tensor
    spare_slot: Tensor
    spare_col: Tensor

    @classmethod
    def make(cls, h: int, k: int, sampler: StaticSampler, device: torch.device) -> _HopConst:
        start, cap, shape = sampler.level_start[h], sampler.capacity[h], sampler.shape
        spread = torch.arange(k * cap, device=device) % SPARE
        return cls(index=h, fanout=k, frontier=slice(start, start + cap), steps=torch.arange(k, device=device),
                   target_pos=torch.arange(start, start + cap, device=device).repeat_interleave(k),
                   cand_idx=torch.arange(k * cap, dtype=torch.int32, device=device),
                   spare_gid=sampler.num_nodes + spread, spare_slot=shape.num_nodes + spread,
                   spare_col=shape.num_edges + spread)
