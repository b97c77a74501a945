"""Weighted neighbour sampling: each target's in-edges drawn with probability proportional to an edge weight.

The option behind the train stage's ``edge_weight`` (a column of the graph's edge features); the uniform kernel of
``stages.runtime.sampling.uniform`` stays as it is when it is off. ID spaces as there: ``edge_idx`` (elid) positions
in the CSR's ``indices``, ``row_pos`` positions in the target array.

- with replacement: every draw picks edge e of its row with probability ``w_e / sum of the row's w``: inverse CDF,
  ``searchsorted`` on the running sum of the weights over the CSR (float64; a zero-weight edge is an empty
  interval, never picked), ``fanout`` draws per row of positive total weight. One table for the whole CSR costs
  precision: an edge lighter than ~2^-52 of the running sum before it (1e8 unit weights: below ~2e-8) is never
  drawn, and rounding at a row's end can pick its last edge even at weight 0; the default, without replacement,
  has neither limit;
- without replacement (Efraimidis and Spirakis, 2006): each edge of positive weight gets the key ``Exp(1) / w_e``
  and a row keeps its ``fanout`` smallest keys: the same law as drawing one edge at a time with probability
  proportional to its weight among those not drawn yet (a 1-edge sample is exactly proportional to the weights).
  Unlike Floyd's k draws of the uniform kernel this touches every in-edge of every target: O(sum of the targets'
  degrees), a sort of them included;
- ``fanout == -1``: every edge of positive weight (a zero-weight edge is never sampled).
"""

from __future__ import annotations

import torch
from torch import Tensor


def weight_running_sum(edge_weight: Tensor) -> Tensor:
    """float64 [E + 1]: ``[0, w_0, w_0 + w_1, ...]``, the inverse-CDF table of the with-replacement draws."""
    return torch.cat([edge_weight.new_zeros(1, dtype=torch.float64), torch.cumsum(edge_weight.double(), 0)])


def sample_weighted_edges(indptr: Tensor, edge_weight: Tensor, weight_sum: Tensor, target_row: Tensor, fanout: int,
                          *, replace: bool, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(count, row_pos, edge_idx)`` as ``uniform.sample_edges_with_counts`` returns them, drawn in proportion to
    ``edge_weight`` (float [E], non-negative; ``weight_sum = weight_running_sum(edge_weight)``), grouped by
    target in the order of ``target_row``."""
    row_start = indptr.index_select(0, target_row)
    row_end = indptr.index_select(0, target_row + 1)
    if replace and fanout != -1:
        return _with_replacement(weight_sum, row_start, row_end, fanout, generator)
    return _without_replacement(edge_weight, row_start, row_end, fanout, generator)


def _with_replacement(weight_sum: Tensor, row_start: Tensor, row_end: Tensor, fanout: int,
                      generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    lo_sum = weight_sum.index_select(0, row_start)
    total = weight_sum.index_select(0, row_end) - lo_sum
    count = torch.where(total > 0, fanout, 0)
    row_pos = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
    u = torch.rand(row_pos.numel(), dtype=torch.float64, device=count.device, generator=generator)
    point = lo_sum.index_select(0, row_pos) + u * total.index_select(0, row_pos)
    # the interval [sum[e], sum[e + 1]) that holds the point is edge e's; clamped to the row against rounding
    edge_idx = torch.searchsorted(weight_sum, point, right=True) - 1
    edge_idx = torch.minimum(torch.maximum(edge_idx, row_start.index_select(0, row_pos)),
                             row_end.index_select(0, row_pos) - 1)
    return count, row_pos, edge_idx


def _without_replacement(edge_weight: Tensor, row_start: Tensor, row_end: Tensor, fanout: int,
                         generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    device = row_start.device
    deg = row_end - row_start
    cand_row_pos = torch.repeat_interleave(torch.arange(deg.numel(), device=device), deg)
    first_slot = torch.cumsum(deg, 0) - deg
    cand_edge = row_start.index_select(0, cand_row_pos) + torch.arange(cand_row_pos.numel(), device=device) \
        - first_slot.index_select(0, cand_row_pos)
    w = edge_weight.index_select(0, cand_edge).double()
    positive = w > 0
    cand_row_pos, cand_edge, w = cand_row_pos[positive], cand_edge[positive], w[positive]
    key = torch.empty_like(w).exponential_(generator=generator) / w
    # by row, then by key: a stable sort by key, then a stable sort of that order by row
    order = torch.argsort(key, stable=True)
    order = order.index_select(0, torch.argsort(cand_row_pos.index_select(0, order), stable=True))
    cand_row_pos, cand_edge = cand_row_pos.index_select(0, order), cand_edge.index_select(0, order)
    per_row = torch.bincount(cand_row_pos, minlength=deg.numel())
    if fanout != -1:
        rank = torch.arange(cand_row_pos.numel(), device=device) - (torch.cumsum(per_row, 0) - per_row).index_select(
            0, cand_row_pos)
        keep = rank < fanout
        cand_row_pos, cand_edge = cand_row_pos[keep], cand_edge[keep]
        per_row = per_row.clamp(max=fanout)
    return per_row, cand_row_pos, cand_edge
