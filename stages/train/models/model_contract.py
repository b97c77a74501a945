"""The model contract: the capability flags a model may declare (``BlockModel``) and the one place they are read
(``capabilities``).

A model is any ``torch.nn.Module``. What it declares decides how the trainer, the loader and inference call it
(``stages.train.models.model.seed_logits``, ``stages.infer.layerwise``): a flag it does not declare takes the default of
``ModelCaps`` (False), so a plain PyG model declares nothing and runs on the whole sampled batch. The built-ins
declare every flag (a test holds them to ``BlockModel``); a plug-in declares the ones it needs, as class attributes
or properties.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["BlockModel", "ModelCaps", "capabilities", "unwrapped"]


@runtime_checkable
class BlockModel(Protocol):
    """What a model declares about how it is called. Read-only properties here so that a class attribute and a
    property both satisfy it; ``capabilities`` is the one reader (defaults for what a model leaves out)."""

    @property
    def supports_blocks(self) -> bool:
        """The block protocol: ``forward(x, *, blocks)`` takes the rows of the batch's ``n_id`` and one
        ``stages.train.models.blocks.Block`` per layer (first layer first) and returns the rows of the last block's
        targets, the seeds; the model has an int ``num_layers``. False: called on the whole sampled batch,
        ``model(x, edge_index)`` (docs/design.md §5)."""
        ...

    @property
    def needs_degrees(self) -> bool:
        """The batches carry ``batch.deg`` (true in-degree + 1 of every ``n_id`` position, ``Block.deg``): GCN's
        normalisation with the graph's degrees. Read only with ``supports_blocks``."""
        ...

    @property
    def supports_offset_targets(self) -> bool:
        """A layer's step is right for targets anywhere among its sources (``Block.dst_start``), not only first:
        layer-wise inference then reads a layer's rows straight from the previous layer's matrix
        (``stages.infer.layerwise``); False: it gathers each chunk's sources first."""
        ...

    @property
    def needs_node_types(self) -> bool:
        """A typed body on the whole batch: called ``model(x, edge_index, edge_type, node_type=...)``
        (``stages.train.models.typed_model.HeteroBody``, ``stages.train.models.hgt``)."""
        ...


@dataclass(frozen=True)
class ModelCaps:
    """A model's flags as read (``BlockModel`` documents each), the defaults for what it does not declare."""

    supports_blocks: bool = False
    needs_degrees: bool = False
    supports_offset_targets: bool = False
    needs_node_types: bool = False

    @property
    def attach_degrees(self) -> bool:
        """Whether its batches must carry ``batch.deg``: a block model that needs the degrees."""
        return self.supports_blocks and self.needs_degrees


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper (the trainer passes the wrapper: its forward syncs)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def capabilities(model: torch.nn.Module) -> ModelCaps:
    """The flags ``model`` (or the module DDP wraps) declares, ``ModelCaps``' default for each it does not. Read
    on each call, not cached: a test may set a flag on an instance."""
    module = unwrapped(model)
    return ModelCaps(**{f.name: bool(getattr(module, f.name, f.default)) for f in dataclasses.fields(ModelCaps)})
