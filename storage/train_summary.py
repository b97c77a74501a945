"""The train stage's summary (and ``metrics.json``) as a typed record, with task-neutral names.

The stored keys still carry accuracy names (``test_acc``, ``best_val_acc``, ...) although under task=link they
hold the MRR: ``TrainSummary`` names them for what they are (``test_metric`` & co., the metric named by
``metric_name``), so readers stop depending on the accident. ``from_json`` reads the stored keys, and the neutral
ones too, so that a later switch of the written keys keeps artifacts already built readable; ``to_json`` writes
the stored keys (the train stage's output is unchanged) and every key this record does not name, as it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# record attribute -> the key metrics.json and the train summary store it under today
STORED_KEYS: dict[str, str] = {
    "test_metric": "test_acc",
    "test_metric_last": "test_acc_last",
    "best_val_metric": "best_val_acc",
    "final_val_metric": "final_val_acc",
}
# per-epoch record (``stages.train.rank.stats.EpochStats``) attribute -> stored key
EPOCH_KEYS: dict[str, str] = {"train_metric": "train_acc", "val_metric": "val_acc"}
_NAMED = ("best_epoch", "last_epoch", "stopped_early", "epochs", "task", "model", "test_metrics")


def _read(data: Mapping[str, Any], name: str, stored: str) -> Any:
    """The value under the neutral ``name``, else under the ``stored`` (accuracy-named) key; None if neither."""
    return data[name] if name in data else data.get(stored)


def epoch_metric(epoch: Mapping[str, Any], name: str) -> float | None:
    """One per-epoch metric (``train_metric`` or ``val_metric``) of a stored epoch record, by either name."""
    return _read(epoch, name, EPOCH_KEYS[name])


@dataclass
class TrainSummary:
    """The train stage's figures that other code reads. Metrics are the task's selected metric (``metric_name``:
    accuracy, or link prediction's mrr); None where the split is empty."""

    metric_name: str = "accuracy"
    test_metric: float | None = None        # the published (best-validation) model's
    test_metric_last: float | None = None   # the last epoch's model's
    best_val_metric: float | None = None    # None without a validation split
    final_val_metric: float | None = None
    best_epoch: int = 0                     # 0-based
    last_epoch: int = 0
    stopped_early: bool = False
    epochs: list[dict[str, Any]] = field(default_factory=list)
    task: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    test_metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)   # every other key, kept as it came

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainSummary:
        """From a train summary or ``metrics.json``, old (accuracy-named) keys or neutral ones."""
        task = dict(data.get("task") or {})
        metrics = {name: _read(data, name, stored) for name, stored in STORED_KEYS.items()}
        known = set(STORED_KEYS) | set(STORED_KEYS.values()) | set(_NAMED) | {"metric_name"}
        return cls(metric_name=str(data.get("metric_name", task.get("metric", "accuracy"))), **metrics,
                   best_epoch=int(data.get("best_epoch", 0)), last_epoch=int(data.get("last_epoch", 0)),
                   stopped_early=bool(data.get("stopped_early", False)), epochs=list(data.get("epochs", [])),
                   task=task, model=dict(data.get("model") or {}), test_metrics=dict(data.get("test_metrics") or {}),
                   extra={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """The stored form: today's keys (``STORED_KEYS``), the named fields and the extra keys."""
        out: dict[str, Any] = dict(self.extra)
        out.update({stored: getattr(self, name) for name, stored in STORED_KEYS.items()})
        out.update({name: getattr(self, name) for name in _NAMED})
        return out

    def best_epoch_record(self) -> dict[str, Any]:
        """The stored record of the best (published) epoch; empty if absent."""
        return next((e for e in self.epochs if e.get("epoch") == self.best_epoch), {})
