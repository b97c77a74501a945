"""A plug-in model for typed graphs written against PyG's ``HeteroData`` API::

    gnnpipe run --set dataset=synthetic-hetero --set model=examples.hetero_model:build

A factory with a ``metadata`` parameter is a typed plug-in: the train stage calls it with the sizes
(``in_channels`` = ``hidden``: gnnpipe's typed input maps every node type to ``hidden`` columns first, features
through a linear map, featureless types as learnt embeddings), ``metadata`` = ``(node types, edge types)`` as
``HeteroData.metadata()`` gives them, and ``model_kwargs``. Its ``forward(x_dict, edge_index_dict)`` gets the
sampled batch per type, as PyG's hetero ``NeighborLoader`` lays it out (a type's seeds lead its rows), and returns
a dict of outputs per node type: the labelled type's rows are the logits the loss sees; inference predicts every
node of each type the dict holds (``out_channels`` columns). ``to_hetero(model, metadata)`` modules and
``HeteroConv`` / ``HGTConv`` stacks fit as they are.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import HeteroConv, SAGEConv


class TypedSAGE(nn.Module):
    """One GraphSAGE conv per edge type, summed per target type (``HeteroConv``), then a linear map per type to the
    classes."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
                 metadata: tuple[list[str], list[tuple[str, str, str]]], aggr: str = "mean") -> None:
        super().__init__()
        node_types, edge_types = metadata
        self.convs = nn.ModuleList(
            HeteroConv({e: SAGEConv(in_channels if i == 0 else hidden, hidden, aggr=aggr) for e in edge_types},
                       aggr="sum")
            for i in range(num_layers))
        self.heads = nn.ModuleDict({t: nn.Linear(hidden, out_channels) for t in node_types})
        self.dropout = dropout

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict[tuple[str, str, str], Tensor]
                ) -> dict[str, Tensor]:
        h = x_dict
        for conv in self.convs:
            out = conv(h, edge_index_dict)
            # a type that is no edge type's target gets no conv output: it keeps its rows
            h = {t: F.dropout(F.relu(out[t]), self.dropout, self.training) if t in out else x for t, x in h.items()}
        return {t: self.heads[t](x) for t, x in h.items()}


def build(in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
          metadata: tuple[list[str], list[tuple[str, str, str]]], aggr: str = "mean") -> TypedSAGE:
    return TypedSAGE(in_channels, hidden, out_channels, num_layers, dropout, metadata, aggr)
