"""A plug-in model and loss for gnnpipe's train stage, without editing gnnpipe::

    gnnpipe run --set model=examples.custom_model:build --set 'model_kwargs={aggr: max}' \\
                --set loss=examples.custom_model:smoothed_cross_entropy

``build`` is a factory: the train stage calls it with the sizes it derives from the data and the parameters
(``in_channels``, ``hidden``, ``out_channels``, ``num_layers``, ``dropout``) plus ``model_kwargs``, on every rank,
after seeding torch (equal initial weights). It returns a plain PyG model, ``forward(x, edge_index)`` over the whole
sampled batch (gnnpipe takes the seeds' rows, the batch's first ones, and says in the log that the batch runs whole);
a model that follows the block protocol of ``stages.train.models.model`` runs layer by layer instead.
``smoothed_cross_entropy`` is a loss: ``(logits of the seeds, their labels) -> the batch's mean``, a 0-d tensor.

The module is found like any Python import (PYTHONPATH, installed packages), and from the directory gnnpipe runs
in and from the gnnpipe checkout (which is how ``examples.`` resolves). Its code is part of the train artifact's
key: change it, and the next run trains again.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv


class SkipSAGE(nn.Module):
    """GraphSAGE layers plus a linear skip from each node's own features to the output."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
                 aggr: str) -> None:
        super().__init__()
        dims = [in_channels] + [hidden] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(SAGEConv(a, b, aggr=aggr) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.skip = nn.Linear(in_channels, out_channels)
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), p=self.dropout, training=self.training)
        return h + self.skip(x)


def build(*, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
          aggr: str = "mean") -> nn.Module:
    """The factory named by ``model=examples.custom_model:build``; ``aggr`` comes from ``model_kwargs``."""
    return SkipSAGE(in_channels, hidden, out_channels, num_layers, dropout, aggr)


def smoothed_cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy with label smoothing 0.1 (Szegedy et al. 2016): the loss named by
    ``loss=examples.custom_model:smoothed_cross_entropy``."""
    return F.cross_entropy(logits, y, label_smoothing=0.1)

