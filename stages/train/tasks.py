"""The Task seam: what a learning task tells the trainer, so that the trainer and the loops hold no task's code.

A task names its items per split (what a batch is made of: seed nodes, or positive edges), turns a batch of items
into the nodes to sample around and a target, the sampled batch into outputs, scores them (the loss to minimise;
additive metric sums that ranks all-reduce) and names its evaluator. ``NodeClassification`` (here) is the default;
``LinkPrediction`` (``stages.train.link_task``) is the second ``Task``, not a second trainer: the ``Trainer``
(``stages.train.trainer``) and the loops (``stages.train.loop``) only call these members.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.train.model import seed_logits
from storage.errors import InputError

LabelOf = Callable[[Tensor], Tensor]   # seed gids -> int64 labels on the training device
LossFn = Callable[[Tensor, Tensor], Tensor]   # (outputs, targets) -> the batch's mean loss, 0-d


class Task(Protocol):
    name: str                     # in reports: "node classification"
    evaluator: str                # what ``metric`` is: "accuracy (OGB Evaluator acc)"
    metric_name: str              # the selected metric's short name: "accuracy", "mrr"
    sum_names: tuple[str, ...]    # the entries of ``metric_sums``, e.g. ("correct", "total")

    def seeds(self, split: str) -> Tensor:
        """This rank's items of ``split`` (``SPLITS``), 1-D on the training device: the loader shuffles and
        batches them (node gids; under task=link, link items: docs/design.md §4)."""
        ...

    def batch(self, item: Tensor, *, training: bool) -> tuple[Tensor, Any]:
        """``(seed gids to sample around, target)`` of a batch of items: what ``forward``, ``loss`` and
        ``metric_sums`` read. Every rank calls it for every batch, empty ones too (it may be a collective)."""
        ...

    def size(self, target: Any) -> int:
        """How many items ``target`` scores: what the batch's mean loss is a mean over."""
        ...

    def forward(self, model: torch.nn.Module, x: Tensor | dict[str, Tensor], batch: Data, target: Any) -> Any:
        """The model's outputs for the batch (``x``: the rows of ``batch.n_id``; a typed graph's per node type)."""
        ...

    def loss(self, out: Any, target: Any) -> Tensor:
        """The mean loss of the batch, 0-d; an empty batch gives 0 that still reaches every parameter (DDP)."""
        ...

    def metric_sums(self, out: Any, target: Any) -> list[float]:
        """Sums over the batch that add up across batches and ranks (``sum_names``)."""
        ...

    def metric(self, sums: Sequence[float]) -> float:
        """The selected metric from sums added over every batch of every rank; NaN when they cover no item (an
        empty split: the report says n/a, and model selection falls back to the last epoch)."""
        ...

    def metrics(self, sums: Sequence[float]) -> dict[str, float | None]:
        """Every metric the sums give, by name (``metrics.json``'s ``test_metrics``); None for an empty split."""
        ...


def checked_loss(value: Any, name: str) -> Tensor:
    """``value`` if it is what a loss must return (a 0-d tensor); a plug-in's anything else is one InputError."""
    if not isinstance(value, Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise InputError(f"loss {name} returned {shape}: it must return a 0-d tensor, the batch's mean loss")
    return value


def ogb_accuracy_counts(input_dict: dict[str, Tensor]) -> tuple[int, int]:
    """``(correct, total)`` for the OGB node-property Evaluator's input format ``{"y_true": [n, 1], "y_pred":
    [n, 1]}``: accuracy is their ratio, and counts (unlike ratios) can be summed across ranks."""
    y_true, y_pred = input_dict["y_true"], input_dict["y_pred"]
    if y_true.shape != y_pred.shape or y_true.dim() != 2:
        raise ValueError(f"y_true {tuple(y_true.shape)} and y_pred {tuple(y_pred.shape)} must both be [n, 1]")
    return int((y_true == y_pred).sum()), int(y_true.shape[0])


class NodeClassification:
    """One class per node: logits of the seeds, a classification loss (cross-entropy unless a plug-in's), and
    accuracy as the OGB Evaluator computes it."""

    name: str = "node classification"
    evaluator: str = "accuracy (OGB Evaluator acc)"
    metric_name: str = "accuracy"
    sum_names: tuple[str, ...] = ("correct", "total")

    def __init__(self, label_of: LabelOf, split_gid: Mapping[str, Tensor] | None = None, *,
                 loss_fn: LossFn | None = None, loss_name: str = "cross_entropy", precision: str = "float32") -> None:
        """``label_of``: seed gids -> labels on the device; ``split_gid``: this rank's seed gids per split;
        ``precision``: of the model's matrix products (``seed_logits``)."""
        self.label_of, self.split_gid = label_of, split_gid
        self.loss_fn: LossFn = loss_fn or torch.nn.functional.cross_entropy
        self.loss_name, self.precision = loss_name, precision

    def seeds(self, split: str) -> Tensor:
        if self.split_gid is None:
            raise ValueError("this NodeClassification was built without seeds (split_gid)")
        return self.split_gid[split]

    def batch(self, item: Tensor, *, training: bool) -> tuple[Tensor, Tensor]:
        """The items are the seed gids; the target their labels."""
        return item, self.label_of(item)

    def size(self, target: Tensor) -> int:
        return int(target.numel())

    def forward(self, model: torch.nn.Module, x: Tensor | dict[str, Tensor], batch: Data, target: Tensor) -> Tensor:
        return seed_logits(model, x, batch, precision=self.precision)

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        if y.numel() == 0:   # a padding rank's empty batch: a mean over nothing would be NaN
            return out.sum() * 0.0
        return checked_loss(self.loss_fn(out, y), self.loss_name)

    def metric_sums(self, out: Tensor, y: Tensor) -> list[float]:
        correct, total = ogb_accuracy_counts({"y_true": y[:, None], "y_pred": out.detach().argmax(1)[:, None]})
        return [float(correct), float(total)]

    def metric(self, sums: Sequence[float]) -> float:
        correct, total = sums
        return correct / total if total else math.nan   # an empty split has no accuracy (not 0 %)

    def metrics(self, sums: Sequence[float]) -> dict[str, float | None]:
        value = self.metric(sums)
        return {"accuracy": None if math.isnan(value) else value}
