"""A plug-in link decoder and loss for gnnpipe's link prediction (``task=link``), without editing gnnpipe::

    gnnpipe run --set task=link --set dataset=synthetic-link \\
                --set decoder=examples.link_decoder:bilinear --set loss=examples.link_decoder:margin_loss

``bilinear`` is a decoder factory: the train stage calls it with ``channels`` (the width of the node embeddings
the model's last layer outputs, ``hidden``) on every rank after seeding torch, and trains what it returns in the
same DDP module as the model. A decoder maps the two ends' embeddings ``h_src``, ``h_dst`` (``[..., channels]``
each) to one score per pair (``[...]``, a logit: higher means more likely an edge).

``margin_loss`` is a loss: ``(positive scores [B], negative scores [n]) -> the batch's mean loss``, a 0-d tensor
(a negative scored within 1 of the mean positive is penalised). An empty batch (a rank padding its last batches)
must still return a 0-d tensor connected to the scores.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Bilinear(nn.Module):
    """``h_src^T W h_dst``: DistMult-like when W is diagonal; a full W scores directed relations asymmetrically."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(channels) + 0.01 * torch.randn(channels, channels))

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return ((h_src @ self.weight) * h_dst).sum(-1)


def bilinear(channels: int) -> nn.Module:
    return Bilinear(channels)


def margin_loss(pos: Tensor, neg: Tensor) -> Tensor:
    if pos.numel() == 0 or neg.numel() == 0:
        return pos.sum() * 0.0 + neg.sum() * 0.0
    return torch.relu(1.0 - pos.mean() + neg).mean()
