"""Multi-hop neighbour sampling across partitions held by different ranks, with collectives only (no RPC).

Rank r holds partition r: the ``LocalCSR`` of incoming edges of the gids ``[bounds[r], bounds[r+1])``. Per hop,
each rank routes its frontier gids to their owners and gets back sampled neighbour gids::

    owner = searchsorted(bounds, gid, right=True) - 1; frontier grouped by owner
    1. all_to_all_single  target counts       requester -> owner
    2. all_to_all_single  target gids         requester -> owner   (variable splits)
       owner: sample_typed(own csr, gid - start_gid)   (every edge type into the target)
    3. all_to_all_single  neighbour counts    owner -> requester   (one per target)
    4. all_to_all_single  neighbour codes     owner -> requester   (variable splits)
    5. all_to_all_single  edge egids          owner -> requester   (only with ``with_edges``: the same splits)
    6. all_to_all_single  edge feature rows   owner -> requester   (only with ``with_edges`` and ``edge_attr``)

The owner of a sampled edge is the owner of its target (it stores the target's in-edges), which is the rank that
sampled it: its features ride along with the answer (6.) instead of a second round trip of egids to their owners
(a ``DistFeatures`` gather by ``e_id``: 3 more collectives, the ids sent back where they came from). Measured on a
300 k-node graph (benchmarks/RESULTS.md, "Carrying edges"), that gather doubled the sampler's CPU time a batch.

A neighbour's code is ``nbr_gid * R + edge_type`` (R edge types; with R = 1 the gid itself): a typed graph keeps
these 4 collectives per hop instead of one set per edge type (28 per hop on ogbn-mag with its reverses).

Every rank issues exactly these collectives per hop (4, or 5-6 on every rank when the run needs edges), also with
an empty frontier or an empty batch: collectives match by call order, so a rank that skipped one would hang the
others (lockstep). A world of one rank issues none: it samples its own CSR as ``NeighborSampler`` does.
Exchanges run on the CSR's device for nccl (CUDA) and on the CPU for gloo. Each owner draws from its own
generator (seed it with ``seed + rank``): a run is reproducible for a fixed world size, seeds and ranks' call order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.collectives import all_to_all, comm_device, max_over_ranks
from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.fanouts import Fanout
from stages.runtime.sampling.sampler import HopEdges, MultiHopSampler, sample_own_hop, shuffled
from stages.runtime.sampling.uniform import sample_typed_edges
from stages.runtime.segments import offsets_of, repeat_positions


def _split_totals(count: Tensor, split: list[int]) -> list[int]:
    """Sums of ``count`` over consecutive runs of lengths ``split`` (per-rank totals of per-target counts)."""
    ends = torch.tensor(np.cumsum(split), dtype=torch.long, device=count.device)
    csum = offsets_of(count)
    at_ends = csum[ends].tolist()
    return [b - a for a, b in zip([0] + at_ends[:-1], at_ends)]


class DistNeighborSampler(MultiHopSampler):
    """``NeighborSampler`` over partition ``rank`` of a graph split by ``bounds``; same ``Data`` batches.

    All ranks of ``group`` must call ``sample`` the same number of times (an empty ``seed_gid`` is fine):
    see ``iter_equal_seed_batches``. Seeds may be any gids (usually this rank's own train gids). ``generator``
    lives on the CSR's device; seed it with ``seed + rank`` so that ranks draw different streams.
    """

    def __init__(self, csr_local: LocalCSR, bounds: Tensor | np.ndarray | list[int], fanouts: Iterable[Fanout], *,
                 replace: bool = False, generator: torch.Generator | None = None,
                 group: dist.ProcessGroup | None = None, node_map: str = "auto",
                 num_edges: int | None = None) -> None:
        """``num_edges``: the whole graph's edge count, when known: egids then travel as int32 if they fit."""
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        bounds_gid = torch.as_tensor(np.asarray(bounds, dtype=np.int64)).to(csr_local.device)
        if bounds_gid.numel() != self.world_size + 1:
            raise ValueError(f"{bounds_gid.numel() - 1} partitions for {self.world_size} ranks: "
                             f"run one rank per partition")
        own_lo, own_hi = int(bounds_gid[self.rank]), int(bounds_gid[self.rank + 1])
        if (csr_local.start_gid, csr_local.end_gid) != (own_lo, own_hi):
            raise ValueError(f"rank {self.rank} holds gids [{csr_local.start_gid}, {csr_local.end_gid}) but "
                             f"bounds give it [{own_lo}, {own_hi}); load part-{self.rank}")
        super().__init__(int(bounds_gid[-1]), fanouts, csr_local.device, replace=replace, generator=generator,
                         node_map=node_map)
        self.csr = csr_local
        self.bounds_gid = bounds_gid
        self._comm_device = comm_device(group)
        self.num_edge_types = csr_local.num_edge_types
        # counts and codes travel as int32 when every code fits (N * R < 2^31): half the bytes of int64
        self._wire_dtype = torch.int32 if self.num_nodes * self.num_edge_types < 2**31 else torch.long
        self._egid_wire_dtype = torch.int32 if num_edges is not None and num_edges < 2**31 else torch.long

    def _sample_hop(self, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
        world = self.world_size
        if world == 1:
            # one rank owns every target: the exchanges below would each hand a tensor back to this rank, at the
            # cost of a collective and a host sync for its splits (4-6 a hop; on one H100 the batch path syncs 64
            # times a batch). The same draws in the same order: the same batches (tests/test_dist_sampler.py)
            return sample_own_hop(self, self.csr, frontier_gid, fanout)

        def exchange(send: Tensor, send_split: list[int], recv_split: list[int]) -> Tensor:
            return all_to_all(send, send_split, recv_split, self.group, self._comm_device, self._wire_dtype)

        owner_part = torch.searchsorted(self.bounds_gid, frontier_gid, right=True) - 1
        req_row_pos = torch.argsort(owner_part, stable=True)   # frontier position of each request, by owner
        req_gid = frontier_gid.index_select(0, req_row_pos)
        req_count = torch.bincount(owner_part, minlength=world)
        # 1. target counts, 2. target gids (requester -> owner)
        got_count = exchange(req_count, [1] * world, [1] * world)
        req_split, got_split = req_count.tolist(), got_count.tolist()
        got_gid = exchange(req_gid, req_split, got_split)
        # owner side: neighbours grouped by target, targets grouped by requesting rank
        nbr_count, _, edge_idx, nbr_type = sample_typed_edges(self.csr, got_gid - self.csr.start_gid, fanout,
                                                              replace=self.replace, generator=self.generator)
        nbr_gid = self.csr.gids(edge_idx)
        nbr_code = nbr_gid if nbr_type is None else nbr_gid * self.num_edge_types + nbr_type
        # 3. neighbour counts per target, 4. neighbour codes (owner -> requester), in request order
        ans_count = exchange(nbr_count, got_split, req_split)
        send_split, recv_split = _split_totals(nbr_count, got_split), _split_totals(ans_count, req_split)
        ans_code = exchange(nbr_code, send_split, recv_split)
        ans_row_pos = req_row_pos.index_select(0, repeat_positions(ans_count, ans_code.numel()))
        ans_egid = ans_attr = None
        if self.with_edges:   # 5. the edges' egids, 6. their feature rows, in the codes' order (owner -> requester)
            ans_egid = all_to_all(edge_idx + self.csr.start_egid, send_split, recv_split, self.group,
                                  self._comm_device, self._egid_wire_dtype)
            if self.edge_attr is not None:
                ans_attr = all_to_all(self.edge_attr.index_select(0, edge_idx), send_split, recv_split, self.group,
                                      self._comm_device)
        if nbr_type is None:
            return HopEdges(ans_row_pos, ans_code, None, ans_egid, ans_attr)
        return HopEdges(ans_row_pos, torch.div(ans_code, self.num_edge_types, rounding_mode="floor"),
                        torch.remainder(ans_code, self.num_edge_types), ans_egid, ans_attr)


def proportional_share(total: int, mine: int, everyone: int) -> int:
    """A rank's (or partition's) part of ``total`` items when it holds ``mine`` of ``everyone``'s: rounded up, so
    the parts cover ``total`` (the train stage's ``edges_per_epoch`` share, and the hotness stage's mirror of it)."""
    return math.ceil(total * mine / everyone) if everyone else 0


def equal_batch_count(num_local_seeds: int, batch_size: int, group: dist.ProcessGroup | None = None) -> int:
    """Batches per epoch that every rank runs: the largest ``ceil(num_local_seeds / batch_size)`` (a collective)."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    return max_over_ranks(math.ceil(num_local_seeds / batch_size), group)


def iter_equal_seed_batches(train_gid: Tensor, batch_size: int, *, generator: torch.Generator | None = None,
                            group: dist.ProcessGroup | None = None, limit: int | None = None) -> Iterator[Tensor]:
    """One epoch of this rank's shuffled ``train_gid`` in ``equal_batch_count`` batches (same on every rank);
    ``limit``: only the first so many of the shuffled seeds (a fresh sample of them every epoch).

    A rank with fewer batches pads with extra batches recycling its own shuffled seeds (cyclically, ``min(
    batch_size, n)`` per batch, so seeds stay unique within a batch); a rank with no seeds yields empty
    batches, which the samplers accept and still join every exchange with. The count collective runs once,
    when iteration starts.
    """
    order_gid = shuffled(train_gid, generator)[:limit]
    num_batches = equal_batch_count(order_gid.numel(), batch_size, group)
    num_seeds = order_gid.numel()
    for b in range(num_batches):
        lo = b * batch_size
        if lo < num_seeds:
            yield order_gid[lo:lo + batch_size]
        else:
            recycled_idx = (lo + torch.arange(min(batch_size, num_seeds), device=order_gid.device)) % max(num_seeds, 1)
            yield order_gid[recycled_idx]
