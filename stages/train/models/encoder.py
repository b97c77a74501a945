"""The node model a train run learns, built from its params and the graph's sizes: one builder for the trainer and
for inference, which must rebuild exactly the module whose ``state_dict`` the trainer published.

Under ``task=link`` the encoder is the node half of the ``LinkModel`` (``stages.train.tasks.link``): its outputs are
embeddings ``hidden`` wide, for the decoder; otherwise the seeds' class logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stages.train.models.plugins import edge_dim_for, make_model, resolve_model
from stages.train.tasks import task_def

if TYPE_CHECKING:
    import torch

    from stages.train.params import Params
    from storage.schema import GraphSchema

__all__ = ["Encoder", "build_encoder", "encoder_edge_dim"]


@dataclass(frozen=True)
class Encoder:
    module: torch.nn.Module
    kind: str            # ``params.model``, ``auto`` resolved for this graph
    out_channels: int    # the classes, or ``hidden`` under task=link
    edge_dim: int        # the edge feature width it takes (0: none, and its batches carry no edges)


def encoder_edge_dim(params: Params, *, typed: bool, num_edge_features: int) -> int:
    """The edge feature width the run's model takes on a graph of ``num_edge_features`` (``edge_dim_for``)."""
    return edge_dim_for(resolve_model(params.model, typed=typed), num_edge_features, params.edge_features)


def build_encoder(params: Params, *, in_channels: int | Mapping[str, int | None], num_classes: int,
                  schema: GraphSchema, num_edge_features: int) -> Encoder:
    """The run's node model (``make_model``), freshly initialised from torch's global generator. ``in_channels``:
    the feature width, or on a typed graph each node type's (None: a learnt embedding); ``num_edge_features``: the
    graph's edge feature width (0: none)."""
    typed = not isinstance(in_channels, int)
    kind = resolve_model(params.model, typed=typed)
    out_channels = task_def(params.task).output_width(params.hidden, num_classes)
    edge_dim = encoder_edge_dim(params, typed=typed, num_edge_features=num_edge_features)
    module = make_model(kind, params.model_kwargs, in_channels=in_channels, hidden=params.hidden,
                        out_channels=out_channels, num_layers=params.num_layers, dropout=params.dropout,
                        heads=params.gat_heads, schema=schema, edge_dim=edge_dim)
    return Encoder(module, kind, out_channels, edge_dim)
