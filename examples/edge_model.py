"""An edge-aware plug-in model: PyG's ``TransformerConv`` with edge features, without editing gnnpipe::

    gnnpipe run --set dataset=synthetic --set num_edge_features=4 --set model=examples.edge_model:build

A factory that declares an ``edge_dim`` parameter is edge-aware (``stages.train.models.plugins.edge_dim_for``): the
train stage calls it with ``edge_dim`` = the graph's edge feature columns (0 when the graph has none or the run sets
``edge_features=false``), and on batches that carry them calls the model ``model(x, edge_index, edge_attr=edge_attr)``:
``edge_attr`` [E, edge_dim] float32 aligned with ``edge_index``, gathered from the edges' owners. With ``edge_dim`` 0 it
is called without ``edge_attr``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import TransformerConv


class EdgeTransformer(nn.Module):
    """``num_layers`` TransformerConv layers: attention scores and messages both see the edge's features."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
                 edge_dim: int, heads: int) -> None:
        super().__init__()
        dims = [in_channels] + [hidden] * (num_layers - 1) + [out_channels]
        # concat=False averages the heads, so every layer's output is its target width
        self.convs = nn.ModuleList(TransformerConv(a, b, heads=heads, concat=False, edge_dim=edge_dim or None)
                                   for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(h, edge_index, edge_attr)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), self.dropout, self.training)
        return h


def build(in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float, edge_dim: int,
          heads: int = 2) -> nn.Module:
    """The factory the train stage calls (module docstring); ``heads`` may come from ``model_kwargs``."""
    return EdgeTransformer(in_channels, hidden, out_channels, num_layers, dropout, edge_dim, heads)
