"""The train report's figures: loss and accuracy per epoch, and the feature-cache hit rate per epoch."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on workers or CI
import matplotlib.pyplot as plt  # noqa: E402

from storage.report import percent  # noqa: E402
from storage.train_summary import TrainSummary, epoch_metric  # noqa: E402


def _pct(value: float | None) -> float:
    """A ratio in %; NaN (a gap in the curve) for None, the metric of an empty split."""
    return math.nan if value is None else 100 * value


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def curves_png(metrics: dict[str, Any]) -> bytes:
    """Training loss (left axis) and the task's metric on train and validation (right axis, in %: accuracy, or link
    prediction's mrr) per epoch, from ``metrics.json``; the best validation epoch marked, with the test metric of
    its model and of the last epoch's."""
    m = TrainSummary.from_json(metrics)
    name = m.metric_name
    epochs = m.epochs
    x = [e["epoch"] + 1 for e in epochs]
    best, last = m.best_epoch + 1, m.last_epoch + 1
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    ax.plot(x, [e["loss"] for e in epochs], "-o", color="C3", ms=3, label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    acc = ax.twinx()
    acc.plot(x, [_pct(epoch_metric(e, "train_metric")) for e in epochs], "-o", color="C0", ms=3, label=f"train {name}")
    acc.plot(x, [_pct(epoch_metric(e, "val_metric")) for e in epochs], "-s", color="C2", ms=3, label=f"val {name}")
    selected = f"best val: epoch {best}" if m.best_val_metric is not None else f"no val split: epoch {best}"
    acc.axvline(best, color="C2", ls=":", alpha=0.7, label=selected)
    acc.plot([best], [_pct(m.test_metric)], "*", color="C1", ms=11,
             label=f"test {name} at best {percent(m.test_metric, 1)}")
    acc.plot([last], [_pct(m.test_metric_last)], "x", color="C7", ms=8, mew=2,
             label=f"test {name}, last epoch {percent(m.test_metric_last, 1)}")
    acc.set_ylabel(f"{name} (%)")
    acc.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()[0] + acc.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + acc.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=7, loc="center right")
    ax.grid(True, alpha=0.3)
    ax.set_title("Training curves (global over ranks)")
    return _png(fig)


def hit_rate_png(epochs: list[dict[str, Any]], policy: str) -> bytes:
    """Share of feature-row lookups served by the device cache, and the remote rows left, per epoch."""
    x = [e["epoch"] + 1 for e in epochs]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    ax.plot(x, [100 * e["hit_rate"] for e in epochs], "-o", color="C0", ms=3, label=f"hit rate ({policy})")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cache hit rate (% of feature lookups)")
    ax.set_ylim(0, 100)
    remote = ax.twinx()
    remote.plot(x, [e["remote_rows"] for e in epochs], "--", color="C1", label="remote rows")
    remote.set_ylabel("remote rows fetched per epoch")
    remote.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()[0] + remote.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + remote.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.set_title("Feature cache per epoch")
    return _png(fig)
