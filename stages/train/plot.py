"""The train report's figures: loss and accuracy per epoch, the feature-cache hit rate per epoch, and where each
rank's epoch time goes (its phases, ``storage.phases``)."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on workers or CI
import matplotlib.pyplot as plt  # noqa: E402

from storage.phases import (  # noqa: E402
    IDLE_COLOUR,
    PHASE_LABELS,
    PHASES,
    PREFETCH_LABELS,
    clock_label,
    epochs_label,
    mean_phases,
)
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


def _phase_colour(name: str) -> Any:
    """A fixed colour per phase, the same in every run's figure (tab10 holds exactly the ten phases)."""
    return plt.get_cmap("tab10")(PHASES.index(name)) if name in PHASES else "0.6"


def phases_png(metrics: dict[str, Any]) -> bytes | None:
    """Each rank's mean epoch split into its phases, a stacked bar per rank (``storage.phases.mean_phases``: the
    first epoch left out as warm-up), and beside it, hatched, the prefetch thread's phases when it had any (work that
    overlaps the model's thread, so it is not part of the epoch's sum); None when the metrics have no phases (a build
    before the split)."""
    epochs = metrics.get("epochs") or []
    main = mean_phases(epochs)
    if main is None:
        return None
    prefetch = mean_phases(epochs, "prefetch_phases_s")   # None: no prefetch thread measured anything
    ranks = max(len(values) for values in main.values())
    names = [n for n in main if any(main[n]) or (prefetch is not None and any(prefetch.get(n, [])))]
    width = 0.38 if prefetch is not None else 0.6
    offset = width / 2 + 0.01 if prefetch is not None else 0.0
    bars_per_rank = 2 if prefetch is not None else 1
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.4, 2.5 + 0.6 * ranks * bars_per_rank)), 4.6), dpi=110)
    x = list(range(ranks))
    for bars, shift, hatch in ((main, -offset, None), (prefetch, offset, "//")):
        if bars is None:
            continue
        bottom = [0.0] * ranks
        for name in names:
            values = (bars.get(name, []) + [0.0] * ranks)[:ranks]
            idle = hatch is not None and name == "wait"   # the prefetch thread's wait: idle, not the model's wait
            ax.bar([i + shift for i in x], values, width, bottom=bottom,
                   color=IDLE_COLOUR if idle else _phase_colour(name), hatch=hatch,
                   edgecolor="white" if hatch is None else "0.25", linewidth=0.5,
                   label=PHASE_LABELS.get(name, name) if hatch is None else None)
            bottom = [b + v for b, v in zip(bottom, values)]
        if hatch is None:
            for i, total in enumerate(bottom):
                ax.annotate(f"{total:.3g} s", (i + shift, total), ha="center", va="bottom", fontsize=7)
    handles, labels = ax.get_legend_handles_labels()
    handles, labels = handles[::-1], labels[::-1]   # top to bottom, as the segments are stacked
    if prefetch is not None:
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="white", edgecolor="0.25", hatch="//", label="prefetch thread (overlaps)"))
        labels.append("prefetch thread (overlaps)")
        if any(prefetch.get("wait", [])):
            idle_label = f"prefetch thread: {PREFETCH_LABELS['wait']}"
            handles.append(Patch(facecolor=IDLE_COLOUR, edgecolor="0.25", hatch="//", label=idle_label))
            labels.append(idle_label)
        ax.set_xticks(x, [f"rank {r}\nmodel | prefetch" for r in x], fontsize=8)
    else:
        ax.set_xticks(x, [f"rank {r}" for r in x])
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_ylabel("seconds per epoch")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)   # room for the totals above the bars
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(f"Where the time goes: {clock_label(metrics.get('phase_clock'))}, mean of {epochs_label(epochs)}",
                 fontsize=9, loc="left")
    return _png(fig)
