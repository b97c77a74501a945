"""A link batch's seeds: every endpoint once, and every pair recovered from its positions."""

from __future__ import annotations

import pytest
import torch

from stages.runtime.link_batch import link_seeds


def test_pairs_are_positions_among_distinct_seeds():
    src, dst = torch.tensor([5, 9, 5]), torch.tensor([7, 5, 2])
    neg = torch.tensor([[9, 11], [3, 7], [7, 7]])
    seeds = link_seeds(src, dst, neg)
    assert torch.equal(seeds.seed_gid, torch.tensor([2, 3, 5, 7, 9, 11]))   # distinct: one sample's seeds
    assert torch.equal(seeds.seed_gid[seeds.src_pos], src) and torch.equal(seeds.seed_gid[seeds.dst_pos], dst)
    assert torch.equal(seeds.seed_gid[seeds.neg_dst_pos], neg)
    assert torch.equal(seeds.seed_gid[seeds.neg_src_pos], src.unsqueeze(1).expand(3, 2))
    empty = link_seeds(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long),
                       torch.empty((0, 4), dtype=torch.long))
    assert empty.seed_gid.numel() == 0 and empty.neg_dst_pos.shape == (0, 4)
    with pytest.raises(ValueError, match=r"give \[B\], \[B\] and \[B, k\]"):
        link_seeds(src, dst[:2], neg)
