"""The GNN models: PyG's BasicGNN family (GraphSAGE by default, GCN and GAT selectable).

Sizes come from the data's metadata (``num_features``, ``num_classes``), never from the user. Forward passes take a
sampled batch and trim each layer to the hops it still needs (``num_sampled_nodes_per_hop``), which the sampler's
layout allows: ``n_id`` lists seeds, then hop 1's new nodes, ...; ``edge_index`` lists hop 1's edges, then hop 2's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.choices import MODELS


def build_model(kind: str, *, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
                heads: int = 4) -> torch.nn.Module:
    """A ``num_layers``-layer GNN mapping ``in_channels`` features to ``out_channels`` class logits."""
    from torch_geometric.nn.models import GAT, GCN, GraphSAGE

    common = {"in_channels": in_channels, "hidden_channels": hidden, "num_layers": num_layers,
              "out_channels": out_channels, "dropout": dropout}
    if kind == "sage":
        return GraphSAGE(**common, aggr="mean")
    if kind == "gcn":
        return GCN(**common)
    if kind == "gat":
        return GAT(**common, heads=heads)
    raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")


def seed_logits(model: torch.nn.Module, x: Tensor, batch: Data) -> Tensor:
    """Logits of the batch's seeds (its first ``batch_size`` nodes), computing only what the seeds depend on."""
    out = model(x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                num_sampled_edges_per_hop=batch.num_sampled_edges)
    return out[:batch.batch_size]
