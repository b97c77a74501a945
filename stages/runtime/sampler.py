"""Uniform neighbour sampling over a CSR of incoming edges, with torch tensor ops only (same code on CPU and CUDA).

ID spaces: ``gid`` global; ``lid = gid - csr.start_gid`` local to the CSR's partition; ``*_pos`` positions in a
batch's ``n_id`` (``row_pos``: in the target array handed to ``sample_neighbors``). Not node ids: ``edge_idx`` (an
edge's **elid**) indexes the CSR's ``indices``, ``row_start = indptr[lid]``; ``egid = csr.start_egid + elid`` is
the edge's global id (``storage.partition``), which batches carry as ``e_id`` when the sampler's ``with_edges``
(and the edges' features as ``edge_attr`` when it holds its edges' rows, ``edge_attr``).

Kernel (``sample_neighbors``), for each target row of degree ``deg`` and a fanout ``k``:

- ``k == -1`` or ``deg <= k`` (without replacement): every neighbour, as a contiguous slice of ``indices``.
- with replacement: ``k`` offsets ``floor(u * deg)``.
- without replacement and ``deg > k``: Robert Floyd's subset algorithm, vectorised across rows: for
  ``j = 0..k-1`` draw ``t`` in ``[0, deg-k+j]``; if ``t`` was already picked in this row take ``deg-k+j`` instead.
  That is an exactly uniform k-subset from exactly ``k`` draws per row, O(k^2) compares per row and no memory
  proportional to ``deg``: a hub with 10^4 neighbours costs what a node with ``k + 1`` does. The loop runs over
  the fanout, never over nodes or edges; on a GPU, where each of its ops is a kernel launch, pointer jumping finds
  the repeats in log2(k) steps instead (``_repeats_by_jumping``: the same picks).

  Measured alternatives (1 thread, rows of degree ~100-1000): random keys for every candidate + a segmented sort
  (top-k per row) was 20-1000x slower, because it materialises and sorts all neighbours of every row; a
  [rows, k] layout or one tensor per pick was up to 1.5x slower than the [k, rows] layout used here.
- a row's output slots become edge positions in ``indices`` (``stages.runtime.segments.expand_rows``: running sums
  on a CPU, where ``repeat_interleave`` is a slow serial kernel; ``repeat_interleave`` of a known size on a GPU,
  where the running sums' ``nonzero`` would stop the host); gathers use ``index_select`` (4-7x faster than
  advanced indexing on CPU).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.csr import LocalCSR
from stages.runtime.fanouts import Fanout, check_fanout, validate_hop_fanouts
from stages.runtime.relabel import NodeMap, make_node_map
from stages.runtime.segments import expand_rows, offsets_of, repeat_positions, stable_order, steps_of
from stages.runtime.weighted import sample_weighted_edges

__all__ = ["HopEdges", "LocalCSR", "MultiHopSampler", "NeighborSampler", "check_seed_range", "floyd_offsets",
           "iter_seed_batches", "sample_edges_with_counts", "sample_neighbors", "sample_neighbors_with_counts",
           "sample_typed", "sample_typed_edges", "shuffled", "uniform_below"]


def uniform_below(n: Tensor, u: Tensor) -> Tensor:
    """``floor(u * n)`` in ``[0, n)`` for ``u`` in [0, 1) (float64: exact enough for any degree)."""
    return torch.minimum((u * n).long(), n - 1)


# a GPU resolves repeats by pointer jumping from this fanout up: 10 + ceil(log2(k - 1)) kernels where the steps take
# 3 (k - 1) (counted on a CPU): 42 -> 14 at k = 15, 27 -> 14 at 10, 15 -> 13 at 6, a tie at 5 (12); fanouts [15,
# 10, 5] save 41 of a batch's ~250 sampling launches. A CPU keeps the steps, 2-2.6x faster there (1 thread, k =
# 15/10/5: 1.0/7.1/35 ms against 1.8/18/62 ms): the pairwise compare is k^2 work
_JUMP_FROM_K = 6
_JUMP_MAX_PAIRS = 2**26   # its [k, k, rows] compare (bytes); products' largest, hop 3 at k = 5: 3.8 M


def floyd_offsets(deg: Tensor, k: int, generator: torch.Generator | None, *,
                   by_jumping: bool | None = None) -> Tensor:
    """[k, rows] offsets in ``[0, deg)``, a uniform k-subset per row (all ``deg > k``), by Floyd's algorithm.

    Step j draws in ``[0, deg - k + j]`` and takes that step's upper end instead when the draw repeats an earlier
    pick. Every step's draw is made up front (one product over the [k, rows] matrix, the same values as one step at
    a time); which draws repeat is ``_repeats_by_steps`` (CPU) or ``_repeats_by_jumping`` (GPU), the same answer.
    Laid out [k, rows] so that each step reads and writes contiguous rows of the matrix.
    """
    rand = torch.rand((k, deg.numel()), dtype=torch.float64, device=deg.device, generator=generator)
    hi = deg - torch.arange(k, 0, -1, device=deg.device).unsqueeze(1)   # [k, rows]: step j's upper end
    drawn = torch.minimum((rand * (hi + 1)).long(), hi)   # uniform_below(hi + 1): each step's draw, j >= 1 may
    # repeat a pick (the bound hi given, not hi + 1 - 1: one op less a hop)
    if k < 2:
        return drawn
    if by_jumping is None:
        by_jumping = deg.is_cuda and k >= _JUMP_FROM_K and k * k * deg.numel() <= _JUMP_MAX_PAIRS
    return torch.where(_repeats_by_jumping(drawn, hi), hi, drawn) if by_jumping else _repeats_by_steps(drawn, hi)


def _repeats_by_steps(drawn: Tensor, hi: Tensor) -> Tensor:
    """Floyd's steps in order, 3 ops each (compare, any, select): the offsets, ``drawn`` overwritten."""
    for j in range(1, drawn.shape[0]):
        taken = (drawn[:j] == drawn[j]).any(0)
        torch.where(taken, hi[j], drawn[j], out=drawn[j])   # hi[j] was not drawable before step j: always new
    return drawn


def _repeats_by_jumping(drawn: Tensor, hi: Tensor) -> Tensor:
    """[k, rows] bool: which draws Floyd's steps replace, in a number of ops that grows with log2(k).

    Draw j is replaced when it equals the pick of an earlier step. Equal to an earlier *draw* it always is (that
    draw or its replacement is in the set: ``repeat``). Else only step ``m = drawn[j] - hi[0]``'s upper end can
    match (upper ends are ``hi[0] + m``), and it is a pick exactly when step m was replaced: so ``replaced[j] =
    repeat[j] or replaced[m]`` for ``0 <= m < j``, a chain towards earlier steps that pointer jumping follows to
    its end, a step that is settled by itself, in ceil(log2(k - 1)) gathers."""
    k = drawn.shape[0]
    step = steps_of(0, k, drawn.device).unsqueeze(1)                               # [k, 1]
    earlier_pair = (drawn.unsqueeze(1) == drawn.unsqueeze(0)) & (step.unsqueeze(2) > step.unsqueeze(0))
    repeat = earlier_pair.any(1)                                                   # [j, i, rows] -> [j, rows]
    m = drawn - hi[0]
    # each step's link in its chain; a settled step (a repeat, or a draw below every upper end) points at itself,
    # and so does m == j (its own upper end: never a repeat) without a test of its own
    ptr = torch.where(repeat | (m < 0), step, m)
    for _ in range(max(1, math.ceil(math.log2(k - 1)))):
        ptr = ptr.gather(0, ptr)
    return repeat.gather(0, ptr)


def sample_neighbors(csr_local: LocalCSR, target_lid: Tensor, fanout: int, *, replace: bool = False,
                     generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Uniformly sample up to ``fanout`` incoming neighbours of each target (``-1``: all of them).

    Returns ``(row_pos, nbr_gid)``: edge ``nbr_gid[i] -> target_lid[row_pos[i]]``, grouped by target in the order
    of ``target_lid`` (``row_pos`` is non-decreasing). Without replacement a target gets ``min(deg, fanout)``
    distinct neighbours; with replacement exactly ``fanout`` (none when it has no neighbours).
    """
    _, row_pos, nbr_gid = sample_neighbors_with_counts(csr_local, target_lid, fanout, replace=replace,
                                                       generator=generator)
    return row_pos, nbr_gid


def sample_neighbors_with_counts(csr_local: LocalCSR, target_lid: Tensor, fanout: int, *, replace: bool = False,
                                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``sample_neighbors`` plus ``count`` (neighbours per target), which the kernel has anyway."""
    count, row_pos, edge_idx = sample_edges_with_counts(csr_local, target_lid, fanout, replace=replace,
                                                        generator=generator)
    return count, row_pos, csr_local.gids(edge_idx)


def sample_edges_with_counts(csr_local: LocalCSR, target_lid: Tensor, fanout: int, *, replace: bool = False,
                             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel (module docstring): ``(count, row_pos, edge_idx)``, the sampled edges' elids in place of their
    neighbours (``indices[edge_idx]``), the same draws. A CSR with ``edge_weight`` draws in proportion to it
    (``stages.runtime.weighted``) instead."""
    check_fanout(fanout)
    device = csr_local.device
    target_lid = target_lid.to(device=device, dtype=torch.long)
    if csr_local.edge_weight is not None and csr_local.weight_sum is not None:
        return sample_weighted_edges(csr_local.indptr, csr_local.edge_weight, csr_local.weight_sum, target_lid,
                                     fanout, replace=replace, generator=generator)
    # index_select / scatter_ rather than ``t[idx]`` / ``t[idx] = v``: 4-10x faster on CPU for 1-D tensors
    row_start = csr_local.indptr.index_select(0, target_lid)
    deg = csr_local.indptr[1:].index_select(0, target_lid) - row_start   # indptr[lid + 1], the + 1 a view
    if fanout == -1:
        count = deg
    elif replace:
        count = torch.where(deg > 0, fanout, 0)
    else:
        count = deg.clamp(max=fanout)
    big = deg > fanout if fanout != -1 and not replace else None   # the rows Floyd's draws subset
    # one host sync: the output sizes (the edges, and the rows to subset) depend on the draws' counts
    first_slot = None
    if big is None:
        total, num_big = int(count.sum()), 0
    else:   # each row's first output slot, whose running sum also gives the total (and expand_rows the slots' rows)
        slot_offsets = offsets_of(count)
        first_slot = slot_offsets[:-1]
        total, num_big = torch.stack([slot_offsets[-1], big.sum()]).tolist()
    if replace and fanout != -1:
        row_pos = repeat_positions(count, total)
        offset = uniform_below(deg.index_select(0, row_pos),
                                torch.rand(total, dtype=torch.float64, device=device, generator=generator))
        return count, row_pos, row_start.index_select(0, row_pos) + offset
    row_pos, edge_idx = expand_rows(count, row_start, total, first_slot=first_slot)
    if big is not None and first_slot is not None and num_big:
        big_row_pos = torch.nonzero_static(big, size=num_big).squeeze(1)   # its size known: no second sync
        offset = floyd_offsets(deg.index_select(0, big_row_pos), fanout, generator)          # [fanout, rows]
        # a subset row's slots hold row_start + j (expand_rows): add offset - j to make them row_start + offset
        steps = steps_of(0, fanout, device).unsqueeze(1)
        slot_pos = first_slot.index_select(0, big_row_pos) + steps
        edge_idx.scatter_add_(0, slot_pos.view(-1), (offset - steps).view(-1))
    return count, row_pos, edge_idx


def sample_typed(csr_local: LocalCSR, target_lid: Tensor, fanout: Fanout, *, replace: bool = False,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``sample_typed_edges`` with each sampled edge's source gid in place of its elid: ``(count, row_pos, nbr_gid,
    edge_type)``."""
    count, row_pos, edge_idx, edge_type = sample_typed_edges(csr_local, target_lid, fanout, replace=replace,
                                                             generator=generator)
    return count, row_pos, csr_local.gids(edge_idx), edge_type


def sample_typed_edges(csr_local: LocalCSR, target_lid: Tensor, fanout: Fanout, *, replace: bool = False,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``sample_neighbors_with_counts`` per (target, edge type) row: up to ``fanout`` in-neighbours of each type
    (``fanout`` one count per edge type: each type its own, 0 = none).

    Returns ``(count, row_pos, edge_idx, edge_type)``: neighbours per target (all types), and per sampled edge its
    target's position in ``target_lid``, its elid (``indices[edge_idx]`` is its source gid) and its edge type
    (``None`` when R = 1: then this is ``sample_edges_with_counts`` itself, same draws). Edges come grouped by
    target, then by edge type. Rows of an edge type whose dst is another node type are empty and cost one ``indptr``
    lookup each.
    """
    num_types = csr_local.num_edge_types
    if isinstance(fanout, tuple):
        if len(fanout) != num_types:
            raise ValueError(f"{len(fanout)} fanouts for a graph of {num_types} edge types")
        if len(set(fanout)) > 1 or fanout[0] == 0:
            count, row_pos, edge_idx, edge_type = _sample_per_edge_type(csr_local, target_lid, fanout, replace,
                                                                        generator)
            return count, row_pos, edge_idx, edge_type if num_types > 1 else None   # R = 1: no types, as below
        fanout = fanout[0]   # one count for every type: the draws of the scalar fanout
    if num_types == 1:
        count, row_pos, edge_idx = sample_edges_with_counts(csr_local, target_lid, fanout, replace=replace,
                                                            generator=generator)
        return count, row_pos, edge_idx, None
    target_lid = target_lid.to(device=csr_local.device, dtype=torch.long)
    row = (target_lid.unsqueeze(1) * num_types + torch.arange(num_types, device=target_lid.device)).view(-1)
    count, rowrow_pos, edge_idx = sample_edges_with_counts(csr_local, row, fanout, replace=replace,
                                                           generator=generator)
    return (count.view(-1, num_types).sum(1), torch.div(rowrow_pos, num_types, rounding_mode="floor"), edge_idx,
            torch.remainder(rowrow_pos, num_types))


def _sample_per_edge_type(csr_local: LocalCSR, target_lid: Tensor, fanout: tuple[int, ...], replace: bool,
                          generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``sample_typed_edges`` with a count per edge type: the (target, e) rows of each type e with its own count, the
    results merged into target-then-type order (one stable sort of the hop's edges by ``target * R + e``)."""
    num_types = csr_local.num_edge_types
    target_lid = target_lid.to(device=csr_local.device, dtype=torch.long)
    count = torch.zeros(target_lid.numel(), dtype=torch.long, device=target_lid.device)
    keys, nbrs = [], []
    for e, f in enumerate(fanout):
        if f == 0:
            continue
        c, row_pos, edge_idx = sample_edges_with_counts(csr_local, target_lid * num_types + e, f,
                                                        replace=replace, generator=generator)
        count += c
        keys.append(row_pos * num_types + e)
        nbrs.append(edge_idx)
    if not keys:
        empty = target_lid.new_empty(0)
        return count, empty, empty, empty
    key = torch.cat(keys)
    order = stable_order(key, target_lid.numel() * num_types)
    key = key.index_select(0, order)
    return (count, torch.div(key, num_types, rounding_mode="floor"), torch.cat(nbrs).index_select(0, order),
            torch.remainder(key, num_types))


@dataclass
class HopEdges:
    """One hop's sampled edges: ``nbr_gid[i] -> frontier[row_pos[i]]``, with their edge types (``None``: one edge
    type), egids and feature rows (``None`` unless the sampler's ``with_edges`` and ``edge_attr``). ``by_target``:
    the edges come grouped by target in frontier order (then by edge type), by construction."""

    row_pos: Tensor
    nbr_gid: Tensor
    edge_type: Tensor | None = None
    egid: Tensor | None = None
    edge_attr: Tensor | None = None
    by_target: bool = False


class MultiHopSampler(ABC):
    """Hop loop shared by the single and distributed samplers; subclasses say how one hop is sampled.

    ``with_edges``: batches also carry ``e_id`` (the sampled edges' egids, aligned with ``edge_index``), and with
    ``edge_attr`` (float [e_p, D]: the features of the CSR's own edges, by elid) their features as ``edge_attr``;
    off by default, and then no edge id or row is computed or exchanged."""

    with_edges: bool = False
    edge_attr: Tensor | None = None

    def __init__(self, num_nodes: int, fanouts: Iterable[Fanout], device: torch.device, *, replace: bool,
                 generator: torch.Generator | None, node_map: str) -> None:
        self.fanouts = validate_hop_fanouts(fanouts)   # per hop: a count, or one per edge type (hop_fanouts)
        self.num_nodes = int(num_nodes)
        self.device = torch.device(device)
        self.replace = bool(replace)
        self.generator = generator
        self._node_map: NodeMap = make_node_map(self.num_nodes, self.device, node_map)

    @abstractmethod
    def _sample_hop(self, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
        """The frontier's sampled edges, ``row_pos`` indexing ``frontier_gid``; ``edge_type`` is ``None`` on a graph
        of one edge type, ``egid`` unless ``with_edges``."""

    def sample(self, seed_gid: Tensor, *, checked: bool = False) -> Data:
        """Multi-hop sample around ``seed_gid`` (unique gids; may be empty) as a PyG ``Data`` batch. ``checked``:
        the caller vouches that the seeds are unique and in range (a loader whose items were checked once,
        ``stages.train.rank.loader``), which saves the batch's two host reads that check them on a GPU.

        Fields: ``n_id`` (gids: seeds first, then new nodes in discovery order), ``edge_index`` [2, E] in
        batch-local positions (row 0 = source/neighbour, row 1 = target), ``batch_size``, ``num_sampled_nodes``
        ([batch_size, new nodes of hop 1, ...]) and ``num_sampled_edges`` (per hop), ``num_nodes``; on a graph
        of several edge types also ``edge_type`` [E] (int64, the schema's edge type ids), as PyG's
        ``to_homogeneous`` lays a typed graph out (``stages.runtime.typed_batch`` makes a ``HeteroData`` of it);
        with ``with_edges`` also ``e_id`` [E] (int64 egids, aligned with ``edge_index``) and, when the sampler holds
        ``edge_attr``, ``edge_attr`` [E, D] (the sampled edges' rows). ``edges_by_target`` (bool): every hop's
        edges came grouped by target (the hops of one CSR), so ``edge_index[1]`` (then ``edge_type``) is
        non-decreasing and the blocks need not check it, a host synchronisation on a GPU (``models.blocks``).
        """
        seed_gid = seed_gid.to(device=self.device, dtype=torch.long).view(-1)
        if seed_gid.numel() and not checked:
            check_seed_range(seed_gid, self.num_nodes)
        nodes = self._node_map
        nodes.start(seed_gid, checked=checked)
        batch_size = seed_gid.numel()
        n_id_parts, hop_edges, hop_types, hop_egids, hop_attrs = [seed_gid], [], [], [], []
        num_sampled_nodes, num_sampled_edges = [batch_size], []
        frontier_gid, frontier_start_pos = seed_gid, 0
        by_target = True
        # every hop runs even when the frontier is empty: the distributed subclass must stay in lockstep
        for fanout in self.fanouts:
            hop = self._sample_hop(frontier_gid, fanout)
            row_pos, nbr_gid = hop.row_pos, hop.nbr_gid
            by_target = by_target and hop.by_target
            nbr_pos, new_gid = nodes.add(nbr_gid)
            if hop.edge_type is not None:
                hop_types.append(hop.edge_type)
            if hop.egid is not None:
                hop_egids.append(hop.egid)
            if hop.edge_attr is not None:
                hop_attrs.append(hop.edge_attr)
            hop_edges.append((nbr_pos, row_pos, frontier_start_pos))   # the frontier is a contiguous run of n_id
            n_id_parts.append(new_gid)
            num_sampled_edges.append(int(nbr_gid.numel()))
            num_sampled_nodes.append(int(new_gid.numel()))
            frontier_start_pos += frontier_gid.numel()
            frontier_gid = new_gid
        n_id = torch.cat(n_id_parts)
        # one write per element into the final tensor (widening int32 positions and offsetting targets on the
        # way): cat + stack would copy every edge twice more, which shows on a memory-bound batch
        edge_index = torch.empty((2, sum(num_sampled_edges)), dtype=torch.long, device=self.device)
        lo = 0
        for nbr_pos, row_pos, frontier_start_pos in hop_edges:
            hi = lo + nbr_pos.numel()
            edge_index[0, lo:hi].copy_(nbr_pos)
            torch.add(row_pos, frontier_start_pos, out=edge_index[1, lo:hi])
            lo = hi
        batch = Data(edge_index=edge_index, n_id=n_id, batch_size=batch_size, num_nodes=int(n_id.numel()),
                     num_sampled_nodes=num_sampled_nodes, num_sampled_edges=num_sampled_edges,
                     edges_by_target=by_target)
        if hop_types:
            batch.edge_type = torch.cat(hop_types)
        if self.with_edges:
            batch.e_id = torch.cat(hop_egids).to(torch.long) if hop_egids else edge_index.new_empty(0)
            if self.edge_attr is not None:
                batch.edge_attr = torch.cat(hop_attrs)
        return batch

    __call__ = sample


class NeighborSampler(MultiHopSampler):
    """Multi-hop uniform neighbour sampler on one ``LocalCSR`` holding the whole graph (bounds ``[0, N]``).

    ``generator`` (on the CSR's device; ``None`` = torch's default one) makes batches reproducible; ``node_map``
    picks the dedup structure (see ``relabel.make_node_map``). Not thread-safe: one sampler per worker.
    """

    def __init__(self, csr: LocalCSR, fanouts: Iterable[Fanout], *, replace: bool = False,
                 generator: torch.Generator | None = None, node_map: str = "auto") -> None:
        if csr.start_gid != 0:
            raise ValueError(f"NeighborSampler needs the whole graph (start_gid 0, got {csr.start_gid}); "
                             f"use DistNeighborSampler for one partition of several")
        super().__init__(csr.num_nodes, fanouts, csr.device, replace=replace, generator=generator,
                         node_map=node_map)
        self.csr = csr

    def _sample_hop(self, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
        return sample_own_hop(self, self.csr, frontier_gid, fanout)


def sample_own_hop(sampler: MultiHopSampler, csr: LocalCSR, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
    """One hop of ``sampler`` where ``csr`` holds the in-edges of every frontier gid: the whole graph, or the one
    partition of a 1-rank ``DistNeighborSampler``. Draws from ``sampler.generator``."""
    frontier_lid = frontier_gid - csr.start_gid if csr.start_gid else frontier_gid   # lone rank: gid == lid
    _, row_pos, edge_idx, edge_type = sample_typed_edges(csr, frontier_lid, fanout,
                                                         replace=sampler.replace, generator=sampler.generator)
    with_attr = sampler.with_edges and sampler.edge_attr is not None
    return HopEdges(row_pos, csr.gids(edge_idx), edge_type, edge_idx + csr.start_egid if sampler.with_edges else None,
                    sampler.edge_attr.index_select(0, edge_idx) if with_attr and sampler.edge_attr is not None
                    else None, by_target=True)   # sample_typed_edges: grouped by target, then by edge type


def check_seed_range(seed_gid: Tensor, num_nodes: int, what: str = "seed gids") -> None:
    """ValueError unless every gid of the non-empty ``seed_gid`` lies in ``[0, num_nodes)`` (one host read);
    ``what``: the gids' name in the message."""
    lo, hi = torch.stack(torch.aminmax(seed_gid)).tolist()   # one host sync for both ends
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"{what} must lie in [0, {num_nodes}); got [{lo}, {hi}]")


def shuffled(train_gid: Tensor, generator: torch.Generator | None) -> Tensor:
    """``train_gid`` in a random order drawn from ``generator`` (on the generator's device)."""
    rand_device = generator.device if generator is not None else train_gid.device
    perm = torch.randperm(train_gid.numel(), generator=generator, device=rand_device)
    return train_gid[perm.to(train_gid.device)]


def iter_seed_batches(train_gid: Tensor, batch_size: int, *, generator: torch.Generator | None = None,
                      drop_last: bool = False, limit: int | None = None) -> Iterator[Tensor]:
    """One epoch: ``train_gid`` reshuffled with ``generator`` (its first ``limit``), cut into batches (the last may
    be short)."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    order_gid = shuffled(train_gid, generator)[:limit]
    stop = order_gid.numel() - (order_gid.numel() % batch_size if drop_last else 0)
    for lo in range(0, stop, batch_size):
        yield order_gid[lo:lo + batch_size]
