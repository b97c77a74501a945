"""The standard recipe around the epochs: best-validation model selection, early stopping, the LR schedule.

The published model and its test metric are those of the epoch with the best validation metric (the first such
epoch on a tie), as papers report (GCN: "the model with the best validation accuracy"); the last epoch's test
metric is reported beside it. Without a validation split (empty: its metric is NaN) the last epoch's model is
published and patience never stops the run. ``patience`` stops training that many epochs after the best one. The
schedule steps once per epoch. All of it is in the checkpoint (``state_dict``), so a resumed run selects, stops
and schedules as an uninterrupted one does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from stages.train.params import Params


def make_scheduler(optimizer: torch.optim.Optimizer, params: Params) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``params.lr_schedule``'s scheduler, stepped after each epoch; None for a constant learning rate."""
    if params.lr_schedule == "cosine":   # lr at epoch 0, down to 0 after the last one
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=params.epochs)
    if params.lr_schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=params.lr_step_epochs, gamma=params.lr_gamma)
    return None


class BestModel:
    """The best validation epoch so far, a CPU copy of its weights, and whether patience has run out."""

    def __init__(self, patience: int | None) -> None:
        self.patience = patience
        self.epoch = -1                          # the best epoch, 0-based; -1: none yet
        self.val = -math.inf
        self.state: dict[str, Tensor] | None = None
        self.extra: dict[str, Any] | None = None   # what else the model is made of (a rank's embedding shards)

    def update(self, epoch: int, val: float, model: torch.nn.Module, extra: dict[str, Any] | None = None) -> bool:
        """Keep ``model``'s weights (and ``extra``, CPU copies) if ``val`` beats the best so far (strictly: the
        earliest best wins). Without a validation split (``val`` NaN) every epoch is the best so far: the last
        epoch's model is published, and patience never stops the run."""
        if not math.isnan(val) and val <= self.val:
            return False
        self.epoch, self.val = epoch, val
        self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self.extra = extra
        return True

    def should_stop(self, last_epoch: int) -> bool:
        """Whether ``patience`` epochs have passed since the best one, ``last_epoch`` being the last completed."""
        return (self.patience is not None and self.epoch >= 0 and not math.isnan(self.val)
                and last_epoch - self.epoch >= self.patience)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "val": self.val, "state": self.state, "extra": self.extra}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.val, self.state = int(state["epoch"]), float(state["val"]), state["state"]
        self.extra = state.get("extra")
