"""The device feature cache: rows of a fixed set of gids (local and remote), loaded once, looked up by gid.

Mechanism only: *which* gids to cache is the cache policy's business (``stages.train.rank.cache_policy``: the hotness
plan, a degree ranking, or nothing); ``DistFeatures.build_cache`` fetches the rows. The cache keeps its gids sorted
and answers a lookup with ``searchsorted``: memory proportional to the cache, no per-node table over all N gids
(docs/design.md §4), and the same torch ops on CPU and CUDA.
"""

from __future__ import annotations

import torch
from torch import Tensor


class FeatureCache:
    """``rows[slot]`` is the feature row of ``gid_sorted[slot]``; both live on the training device."""

    def __init__(self, gid_sorted: Tensor, rows: Tensor) -> None:
        if gid_sorted.numel() != rows.shape[0]:
            raise ValueError(f"{gid_sorted.numel()} gids for {rows.shape[0]} cached rows")
        if gid_sorted.numel() > 1 and not bool((gid_sorted[1:] > gid_sorted[:-1]).all()):
            raise ValueError("cached gids must be sorted and unique")
        self.gid_sorted = gid_sorted
        self.rows = rows

    @classmethod
    def empty(cls, num_features: int, dtype: torch.dtype, device: torch.device) -> FeatureCache:
        return cls(torch.empty(0, dtype=torch.long, device=device),
                   torch.empty((0, num_features), dtype=dtype, device=device))

    @property
    def num_rows(self) -> int:
        return int(self.gid_sorted.numel())

    @property
    def nbytes(self) -> int:
        return int(self.rows.numel() * self.rows.element_size())

    def lookup(self, gid: Tensor) -> tuple[Tensor, Tensor]:
        """``(hit, slot)``: whether each gid is cached and, where it is, its row in ``rows`` (else 0)."""
        if self.num_rows == 0:
            return torch.zeros_like(gid, dtype=torch.bool), torch.zeros_like(gid)
        slot = torch.searchsorted(self.gid_sorted, gid).clamp_(max=self.num_rows - 1)
        hit = self.gid_sorted.index_select(0, slot) == gid
        return hit, slot
