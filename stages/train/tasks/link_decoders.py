"""Link prediction decoders and loss ([6/7], docs/history.md): a pair's score from its two node embeddings.

- ``dot``: ``<h_u, h_v>``, no parameters (GraphSAGE's unsupervised objective; OGB's ogbl-citation2 baselines);
- ``mlp``: an MLP on the Hadamard product ``h_u * h_v``, OGB's ``LinkPredictor`` (ogbl-collab baselines): the
  product keeps the score symmetric in u and v and lets the MLP weigh each embedding dimension.

``link_loss`` is binary cross-entropy with logits over positives (label 1) and negatives (label 0), each side
averaged on its own and the two added, as OGB's baselines train (``-log σ(pos) - log(1 - σ(neg))``): the negative
count ``k`` per positive then sets how many pairs are scored, not how the two sides are weighed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class DotDecoder(torch.nn.Module):
    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return (h_src * h_dst).sum(-1)


class MLPDecoder(torch.nn.Module):
    """``num_layers`` linear layers (ReLU and dropout between) on ``h_u * h_v``, to one logit."""

    def __init__(self, channels: int, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"an MLP decoder needs at least one layer, got {num_layers}")
        sizes = [channels] * num_layers + [1]
        self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.dropout = dropout

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        h = h_src * h_dst
        for lin in self.lins[:-1]:
            h = F.dropout(F.relu(lin(h)), self.dropout, self.training)
        return self.lins[-1](h).squeeze(-1)


def link_loss(pos_score: Tensor, neg_score: Tensor) -> Tensor:
    """The mean BCE-with-logits of the positives (label 1) plus that of the negatives (label 0); a side with no
    pair contributes 0 (a padding rank's empty batch still joins the backward)."""
    def side(score: Tensor, label: float) -> Tensor:
        if score.numel() == 0:
            return score.sum() * 0.0
        return F.binary_cross_entropy_with_logits(score, torch.full_like(score, label))
    return side(pos_score, 1.0) + side(neg_score, 0.0)
