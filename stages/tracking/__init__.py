"""Experiment tracking: what the train and infer stages hand to TensorBoard and MLflow.

- ``events``: TensorBoard event files inside the artifact being built (``tb/`` of ``train/<key>/``
  and ``infer/<key>/``), written from the stage's metrics while its writer is open, so the manifest lists them.
- ``mlflow_runs``: when ``MLFLOW_TRACKING_URI`` is set, one MLflow run per train build (named by the
  train key), logged from the published artifact after the stage published it; the infer stage adds its scalars to
  that run. ``mlflow`` is an optional dependency (``pip install gnnpipe[tracking]``): ``require_mlflow`` refuses a
  set URI without it before any rank starts.

One naming scheme for both: ``train/<field>`` per epoch (step = the 0-based epoch of ``metrics.json``) for every
numeric field of ``metrics["epochs"]`` and ``train/phase_s/<phase>`` for its phases (the slowest rank's),
``train/<figure>`` for the final figures (step = the last epoch), and the infer stage's flat ``scalars``
(``infer/...``) at step 0.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Mapping
from typing import Any

from storage import InputError
from storage.train_summary import TrainSummary


def require_trackers() -> None:
    """Before a stage computes anything: the packages its tracking output needs are importable (``tensorboard``, a
    dependency; ``mlflow`` when ``MLFLOW_TRACKING_URI`` is set): one error now, not an ImportError after training."""
    from stages.tracking.mlflow_runs import require_mlflow

    if importlib.util.find_spec("tensorboard") is None:
        raise InputError("the tensorboard package is missing (the train and infer artifacts hold TensorBoard event "
                         "files): reinstall gnnpipe (make venv, or pip install -e .)")
    require_mlflow()


# the train stage's final figures, by their task-neutral names (``storage.train_summary``: the task's selected
# metric, accuracy or link prediction's mrr; older metrics.json held them under test_acc & co.)
FINAL_FIGURES = ("test_metric", "test_metric_last", "best_val_metric", "final_val_metric", "best_epoch",
                 "last_epoch")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def epoch_scalars(metrics: Mapping[str, Any]) -> Iterator[tuple[str, int, float]]:
    """``(tag, step, value)`` of every numeric per-epoch field (a metric over an empty split, null, is skipped), and
    of each phase of the epoch's split (``storage.phases``; builds before it have none): ``train/phase_s/<phase>``,
    the slowest rank's seconds, the one the others wait for at the epoch's collectives."""
    for record in metrics["epochs"]:
        for name, value in record.items():
            if name != "epoch" and is_number(value):
                yield f"train/{name}", int(record["epoch"]), float(value)
        for phase, per_rank in (record.get("phases_s") or {}).items():
            if per_rank:
                yield f"train/phase_s/{phase}", int(record["epoch"]), float(max(per_rank))


def final_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The train stage's final figures that are numbers (``best_val_metric`` is None without a validation split),
    read through ``TrainSummary`` (metrics.json of any train VERSION)."""
    summary = TrainSummary.from_json(metrics)
    figures = {name: getattr(summary, name) for name in FINAL_FIGURES}
    return {f"train/{name}": float(value) for name, value in figures.items() if is_number(value)}


def flat_params(params: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """Parameters as tracker values: numbers, text and booleans as they are, lists, mappings and null as JSON."""
    return {name: value if isinstance(value, str | int | float | bool) else json.dumps(value, sort_keys=True)
            for name, value in params.items()}


def artifact_keys(stage: str, key: str, upstream: Mapping[str, str]) -> dict[str, str]:
    """``{stage: key}`` of the artifact and of its upstream ones."""
    return {stage: key, **dict(sorted(upstream.items()))}
