"""The train stage's summary (and ``metrics.json``) as a typed record, with task-neutral names.

The train stage (VERSION 6 on) stores its metrics under task-neutral keys: ``test_metric``, ``best_val_metric``,
... with ``metric_name`` beside them (accuracy, or link prediction's mrr), and per epoch ``train_metric`` and
``val_metric``. Builds before it stored the same figures under accuracy names (``test_acc``, ``best_val_acc``,
per epoch ``train_acc``, ``val_acc``) although under task=link they held the MRR: ``from_json`` reads either, so
artifacts already built stay readable; ``to_json`` writes the neutral keys and every key this record does not name,
as it came.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# record attribute -> the key metrics.json and the train summary stored it under before train VERSION 6
OLD_KEYS: dict[str, str] = {
    "test_metric": "test_acc",
    "test_metric_last": "test_acc_last",
    "best_val_metric": "best_val_acc",
    "final_val_metric": "final_val_acc",
}
# per-epoch record (``stages.train.rank.stats.EpochStats``) field -> its key before train VERSION 6
EPOCH_KEYS: dict[str, str] = {"train_metric": "train_acc", "val_metric": "val_acc"}
_NAMED = ("best_epoch", "last_epoch", "stopped_early", "epochs", "task", "model", "test_metrics")


def _read(data: Mapping[str, Any], name: str, stored: str) -> Any:
    """The value under the neutral ``name``, else under the ``stored`` (older, accuracy-named) key; None if
    neither."""
    return data[name] if name in data else data.get(stored)


def epoch_metric(epoch: Mapping[str, Any], name: str) -> float | None:
    """One per-epoch metric (``train_metric`` or ``val_metric``) of a stored epoch record, by either name."""
    return _read(epoch, name, EPOCH_KEYS[name])


class _Fact(Generic[T]):
    """A run fact of the record, read from its ``extra`` under the attribute's name and typed by ``read`` (which
    gets None where the build did not store it)."""

    def __init__(self, read: Callable[[Any], T]) -> None:
        self.read = read
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    def __get__(self, record: Any, owner: type | None = None) -> T:
        return self.read(record.extra.get(self.key))


@dataclass(frozen=True)
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
        metrics = {name: _read(data, name, stored) for name, stored in OLD_KEYS.items()}
        known = set(OLD_KEYS) | set(OLD_KEYS.values()) | set(_NAMED) | {"metric_name"}
        return cls(metric_name=str(data.get("metric_name", task.get("metric", "accuracy"))), **metrics,
                   best_epoch=int(data.get("best_epoch", 0)), last_epoch=int(data.get("last_epoch", 0)),
                   stopped_early=bool(data.get("stopped_early", False)), epochs=list(data.get("epochs", [])),
                   task=task, model=dict(data.get("model") or {}), test_metrics=dict(data.get("test_metrics") or {}),
                   extra={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """The stored form: the neutral keys, ``metric_name``, the named fields and the extra keys (the epochs as
        they came: an older build's keep their accuracy-named keys, which ``epoch_metric`` reads)."""
        out: dict[str, Any] = dict(self.extra)
        out.update({name: getattr(self, name) for name in (*OLD_KEYS, "metric_name", *_NAMED)})
        return out

    # The run's facts: stored beside the metrics (the summary adds nodes, num_partitions and the per-epoch means to
    # metrics.json's), kept in ``extra`` so that ``to_json`` gives back exactly what was stored; read typed here.
    recipe = _Fact(lambda v: dict(v or {}))   # {"loss", "lr", "weight_decay", "lr_schedule", "patience"}
    world_size = _Fact(lambda v: 1 if v is None else int(v))
    nodes = _Fact(lambda v: 1 if v is None else int(v))
    ranks = _Fact(lambda v: list(v or []))   # each global rank's setup row (store, host_gather, cache; types)
    resumed_from_epoch = _Fact(lambda v: None if v is None else int(v))
    device = _Fact(lambda v: "cpu" if v is None else str(v))
    backend = _Fact(lambda v: "" if v is None else str(v))
    prefetch = _Fact(lambda v: None if v is None else int(v))        # the depth the ranks used
    ranks_per_gpu = _Fact(lambda v: None if v is None else int(v))   # GPU ranks: how many shared each card
    cache_policy = _Fact(lambda v: "" if v is None else str(v))
    mean_epoch_s = _Fact(lambda v: 0.0 if v is None else float(v))
    mean_hit_rate = _Fact(lambda v: 0.0 if v is None else float(v))
    remote_bytes_per_epoch = _Fact(lambda v: 0.0 if v is None else float(v))
    # where the time goes (``storage.phases``; ``stages.train.report.phase_summary``): empty before the split
    phase_clock = _Fact(lambda v: None if v is None else str(v))   # "cuda_events" or "wall_clock"
    phase_epochs = _Fact(lambda v: "" if v is None else str(v))    # which epochs the means are of, in words
    phases_s = _Fact(lambda v: dict(v or {}))            # phase -> per rank mean seconds per epoch, model's thread
    prefetch_phases_s = _Fact(lambda v: dict(v or {}))   # the same of the prefetch thread; empty without one

    def best_epoch_record(self) -> dict[str, Any]:
        """The stored record of the best (published) epoch; empty if absent."""
        return next((e for e in self.epochs if e.get("epoch") == self.best_epoch), {})
