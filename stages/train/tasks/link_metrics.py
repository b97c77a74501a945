"""Link prediction metrics, computed as OGB's ``linkproppred.Evaluator`` computes them, over all ranks ([6/7]).

Two protocols, by how negatives are drawn:

- **per-positive negatives** (ogbl-citation2): each positive is ranked among its own k negatives, OGB's rank
  ``1 + (#negatives scoring higher + #scoring at least as high) / 2`` (ties count half); MRR and Hits@1/3/10
  are means over positives, so each rank contributes sums and counts (``RankSums``) and one all-reduce adds them;
- **shared negatives** (ogbl-collab): Hits@K counts the positives scoring above the K-th best of *all* negatives;
  each rank sends its own K best negative scores (``global_kth_negative``: one all-gather of K numbers), after
  which the count is again a sum. With fewer than K negatives in all, OGB scores 1.0; so does ``hits_at_k``.

AUC (``auc``) is not a sum: it needs every rank's scores, which the caller all-gathers first (an evaluation's
scores are small next to a training epoch); ranks' own AUCs do not average to it. It is the Mann-Whitney
statistic with tied scores counted half, as scikit-learn's. Scores must be finite (``-inf`` pads the K best).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.collectives import all_reduce_f64, comm_device
from stages.runtime.sums import FieldSums


def ogb_rank(pos: Tensor, neg: Tensor, neg_mask: Tensor | None = None) -> Tensor:
    """float [n]: each positive's rank among its own negatives ``neg`` [n, k] (module docstring); ``neg_mask``
    [n, k]: the negatives that count (filtered ones do not)."""
    pos = pos.view(-1, 1)
    above, at_least = neg > pos, neg >= pos
    if neg_mask is not None:
        above, at_least = above & neg_mask, at_least & neg_mask
    return 0.5 * (above.sum(1) + at_least.sum(1)).to(torch.float32) + 1


def pair_auc(pos: Tensor, neg: Tensor, neg_mask: Tensor | None = None) -> Tensor:
    """float [n]: the share of each positive's own (counted) negatives that score below it, ties half: the AUC of
    the pairs the per-positive protocol compares, whose mean over positives is additive across ranks (the AUC of
    all positives against all negatives is not: ``auc``). 1 for a positive without a counted negative."""
    pos = pos.view(-1, 1)
    mask = torch.ones_like(neg, dtype=torch.bool) if neg_mask is None else neg_mask
    below = ((neg < pos) & mask).sum(1) + 0.5 * ((neg == pos) & mask).sum(1)
    counted = mask.sum(1)
    return torch.where(counted > 0, below / counted.clamp(min=1), torch.ones_like(below, dtype=torch.float32))


@dataclass
class RankSums(FieldSums):
    """Sums over positives of the per-positive-negative metrics; ``+`` adds two; ``all_reduce`` adds every rank's."""

    reciprocal_rank: float = 0.0
    hits_1: float = 0.0
    hits_3: float = 0.0
    hits_10: float = 0.0
    count: int = 0
    pair_auc: float = 0.0

    @classmethod
    def of(cls, pos: Tensor, neg: Tensor, neg_mask: Tensor | None = None) -> RankSums:
        """The sums over the positives that have a counted negative: one whose every negative was filtered out is
        ranked against nothing (counting it as rank 1 would inflate MRR, most at k = 1)."""
        pos, neg = pos.detach().float(), neg.detach().float()
        if neg_mask is not None:
            ranked = neg_mask.any(1)
            pos, neg, neg_mask = pos[ranked], neg[ranked], neg_mask[ranked]
        rank = ogb_rank(pos, neg, neg_mask)
        return cls(float((1.0 / rank).sum()), float((rank <= 1).sum()), float((rank <= 3).sum()),
                   float((rank <= 10).sum()), int(rank.numel()), float(pair_auc(pos, neg, neg_mask).sum()))

    def all_reduce(self) -> RankSums:
        """Every rank's sums added (a collective: one SUM all-reduce of float64)."""
        return RankSums.from_values(all_reduce_f64(self.values()))

    def means(self) -> dict[str, float | None]:
        """``mrr``, ``hits@1``, ``hits@3``, ``hits@10``, ``auc`` (of the compared pairs, ``pair_auc``); None
        without positives."""
        if self.count == 0:
            return {"mrr": None, "hits@1": None, "hits@3": None, "hits@10": None, "auc": None}
        return {"mrr": self.reciprocal_rank / self.count, "hits@1": self.hits_1 / self.count,
                "hits@3": self.hits_3 / self.count, "hits@10": self.hits_10 / self.count,
                "auc": self.pair_auc / self.count}


def global_kth_negative(neg: Tensor, k: int, group: dist.ProcessGroup | None = None) -> float | None:
    """The K-th largest of every rank's shared negative scores (``neg`` [m], this rank's), or None when they are
    fewer than K in all. A collective when a process group is initialised (one all-gather of K scores a rank)."""
    best = torch.full((k,), float("-inf"), dtype=torch.float64)
    top = torch.topk(neg.double().flatten().cpu(), min(k, neg.numel())).values
    best[:top.numel()] = top
    count = torch.tensor([neg.numel()], dtype=torch.float64)
    if dist.is_initialized():
        device = comm_device(group)
        parts = [torch.empty(k + 1, dtype=torch.float64, device=device) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, torch.cat([best, count]).to(device), group=group)
        gathered = torch.stack(parts).cpu()
        best, count = gathered[:, :k].flatten(), gathered[:, k].sum()
    if int(count.sum()) < k:
        return None
    return float(torch.topk(best, k).values[-1])


def hits_at_k(pos: Tensor, kth_negative: float | None) -> tuple[float, int]:
    """``(positives scoring above the K-th negative, positives)``: sums for Hits@K (all hits when there is no K-th
    negative, as OGB scores it)."""
    if kth_negative is None:
        return float(pos.numel()), int(pos.numel())
    return float((pos > kth_negative).sum()), int(pos.numel())


def auc(pos: Tensor, neg: Tensor) -> float | None:
    """The area under the ROC curve of positives ``pos`` against negatives ``neg`` (any shapes), ties counted half;
    None without one of either."""
    pos, neg = pos.double().flatten(), neg.double().flatten()
    if pos.numel() == 0 or neg.numel() == 0:
        return None
    scores = torch.cat([pos, neg])
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    # average ranks of tied scores (1-based): the mid-point of each run of equal scores
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid_rank = (ends - (counts.double() - 1) / 2)[inverse]
    ranks = torch.empty_like(mid_rank)
    ranks[order] = mid_rank
    n_pos, n_neg = pos.numel(), neg.numel()
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
