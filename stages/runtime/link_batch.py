"""A link prediction batch's seeds ([6/7], docs/history.md): positive pairs and their negatives as one node set.

Both endpoints of every positive and every drawn negative destination become the seeds of ONE multi-hop sample
(one set of collectives per batch, as a node batch has); the pairs are then positions among those seeds, so the
decoder reads each pair's two embeddings straight from the sampled batch's seed rows. Negatives corrupt the
destination of their positive (``k`` per positive, ogbl-citation2's ``target_node_neg``): a negative pair is the
positive's source with a drawn destination.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LinkSeeds:
    """``seed_gid``: the distinct gids to sample around; the pairs as positions in it (``*_pos``)."""

    seed_gid: Tensor       # [S] int64, distinct (sorted)
    src_pos: Tensor        # [B] the positives' sources
    dst_pos: Tensor        # [B] the positives' destinations
    neg_dst_pos: Tensor    # [B, k] each positive's negative destinations (the source is the positive's)

    @property
    def neg_src_pos(self) -> Tensor:
        """[B, k]: a negative pair's source is its positive's."""
        return self.src_pos.unsqueeze(1).expand_as(self.neg_dst_pos)


def link_seeds(src_gid: Tensor, dst_gid: Tensor, neg_dst_gid: Tensor) -> LinkSeeds:
    """The seeds of positives ``src_gid -> dst_gid`` ([B] each) and their negatives ``neg_dst_gid`` ([B, k])."""
    if src_gid.shape != dst_gid.shape or neg_dst_gid.shape[0] != src_gid.shape[0]:
        raise ValueError(f"pairs of {tuple(src_gid.shape)} and {tuple(dst_gid.shape)} with negatives "
                         f"{tuple(neg_dst_gid.shape)}: give [B], [B] and [B, k]")
    b = src_gid.numel()
    seed_gid, inverse = torch.unique(torch.cat([src_gid, dst_gid, neg_dst_gid.reshape(-1)]), return_inverse=True)
    return LinkSeeds(seed_gid, inverse[:b], inverse[b:2 * b], inverse[2 * b:].view(neg_dst_gid.shape))
