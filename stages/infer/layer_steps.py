"""One layer of a model in eval mode, as layer-wise inference runs it (``stages.infer.layerwise``): the step, what
the built-ins apply between layers, a layer's width, and whether a model can be run so at all; a layer's figures
(``LayerStats``) and what the engine hands each hidden layer to (``LayerDone``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.train.models.blocks import Block
from stages.train.models.model import is_block_model


def after_layer(model: Any, layer: int, h: Tensor) -> Tensor:
    """What the built-in models apply between two layers, in eval mode (``stages.train.models.model._BlockForward``,
    PyG's ``BasicGNN``): activation (before or after) the norm; dropout is the identity."""
    act = model.act
    if act is not None and model.act_first:
        h = act(h)
    h = model.norms[layer](h)
    if act is not None and not model.act_first:
        h = act(h)
    return h


def layer_step(model: Any, layer: int, h: Tensor, block: Block, last: bool) -> Tensor:
    """Layer ``layer`` of ``block``'s targets in eval mode: a relational body's own ``infer_step``
    (``stages.train.models.typed_model``), or a built-in's ``block_step`` then its activation and norm."""
    if hasattr(model, "infer_step"):
        return model.infer_step(layer, h, block)
    out = model.block_step(model.convs[layer], h, block, 1.0)
    return out if last else after_layer(model, layer, out)


def layer_width(model: Any, layer: int) -> int:
    """The output columns of layer ``layer``."""
    return int(model.layer_width(layer)) if hasattr(model, "layer_width") else int(model.convs[layer].out_channels)


def has_layer_steps(model: torch.nn.Module) -> bool:
    """Whether ``model`` can be run one layer at a time: a block model with the built-ins' per-layer members, or a
    relational body's ``infer_step``."""
    if not is_block_model(model):
        return False
    return hasattr(model, "infer_step") or all(hasattr(model, a) for a in ("block_step", "convs", "norms", "act"))


# (hidden layer, its rows of this rank's nodes) -> None, or a callable that waits for a write begun in the
# background (the engine keeps the rows until then: the write overlaps the next layer)
LayerDone = Callable[[int, Tensor], Callable[[], Any] | None]


@dataclass
class LayerStats:
    layer: int
    seconds: float = 0.0
    chunks: int = 0
    edges: int = 0            # in-edges aggregated (sampled ones with fanouts)
    source_rows: int = 0      # rows fetched for the chunks' blocks (targets included)
    remote_rows: int = 0      # of which other ranks' rows
    remote_bytes: int = 0
    placement: str = "host"   # where the layer's steps read their rows (``Inference._placement``)
