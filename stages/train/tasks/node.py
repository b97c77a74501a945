"""Node classification behind the Task seam (``stages.train.tasks.base``): one class per node, accuracy as the OGB
Evaluator computes it. Its ``TaskDef`` is ``NODE`` in ``stages.train.tasks.kinds``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.train.models.model import seed_logits
from stages.train.tasks.base import LabelOf, LossFn, checked_loss


def ogb_accuracy_counts(input_dict: dict[str, Tensor]) -> tuple[int, int]:
    """``(correct, total)`` for the OGB node-property Evaluator's input format ``{"y_true": [n, 1], "y_pred":
    [n, 1]}``: accuracy is their ratio, and counts (unlike ratios) can be summed across ranks."""
    y_true, y_pred = input_dict["y_true"], input_dict["y_pred"]
    if y_true.shape != y_pred.shape or y_true.dim() != 2:
        raise ValueError(f"y_true {tuple(y_true.shape)} and y_pred {tuple(y_pred.shape)} must both be [n, 1]")
    return int(_correct(y_true, y_pred)), int(y_true.shape[0])


def _correct(y_true: Tensor, y_pred: Tensor) -> Tensor:
    """The correct predictions, counted on the labels' device."""
    return (y_true == y_pred).sum()


class NodeClassification:
    """One class per node: logits of the seeds, a classification loss (cross-entropy unless a plug-in's), and
    accuracy as the OGB Evaluator computes it."""

    name: str = "node classification"
    evaluator: str = "accuracy (OGB Evaluator acc)"
    metric_name: str = "accuracy"
    sum_names: tuple[str, ...] = ("correct", "total")
    seeds_are_items: bool = True   # ``batch``: the items are the seed gids

    def __init__(self, label_of: LabelOf, split_gid: Mapping[str, Tensor] | None = None, *,
                 loss_fn: LossFn | None = None, loss_name: str = "cross_entropy", precision: str = "float32") -> None:
        """``label_of``: seed gids -> labels on the device; ``split_gid``: this rank's seed gids per split;
        ``precision``: of the model's matrix products (``seed_logits``)."""
        self.label_of, self.split_gid = label_of, split_gid
        self.loss_fn: LossFn = loss_fn or torch.nn.functional.cross_entropy
        self.loss_name, self.precision = loss_name, precision

    @property
    def pads_labels(self) -> bool:
        """Whether a batch's labels may be padded with ``ignore_index`` (-100) entries that count in no loss and no
        metric: cross-entropy's own rule, so a step on a padded batch (``stages.train.rank.graphed``) is the
        unpadded batch's. A plug-in loss may not follow it."""
        return self.loss_fn is torch.nn.functional.cross_entropy

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

    def metric_sums(self, out: Tensor, y: Tensor) -> list[float | Tensor]:
        """The correct predictions as a count on the device (the loop reads it once an epoch: no host
        synchronisation a batch), and the total; what ``ogb_accuracy_counts`` counts."""
        pred = out.detach().argmax(1)
        if y.shape != pred.shape:   # a [n, 1] label would broadcast into an [n, n] count
            raise ValueError(f"labels {tuple(y.shape)} must be one per seed, as the predictions {tuple(pred.shape)}")
        return [_correct(y, pred), float(y.numel())]

    def metric(self, sums: Sequence[float]) -> float:
        correct, total = sums
        return correct / total if total else math.nan   # an empty split has no accuracy (not 0 %)

    def metrics(self, sums: Sequence[float]) -> dict[str, float | None]:
        value = self.metric(sums)
        return {"accuracy": None if math.isnan(value) else value}
