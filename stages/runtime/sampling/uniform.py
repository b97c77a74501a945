"""One hop of uniform neighbour sampling over a CSR of incoming edges, with torch tensor ops only (same code on
CPU and CUDA).

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

import torch
from torch import Tensor

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.fanouts import Fanout, check_fanout
from stages.runtime.sampling.weighted import sample_weighted_edges
from stages.runtime.segments import expand_rows, offsets_of, repeat_positions, stable_order, steps_of

__all__ = ["floyd_offsets", "sample_edges_with_counts", "sample_neighbors", "sample_neighbors_with_counts",
           "sample_typed", "sample_typed_edges", "uniform_below"]


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
    (``stages.runtime.sampling.weighted``) instead."""
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
