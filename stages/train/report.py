"""The train report's "Where the time goes": each rank's epoch split into phases (``storage.phases``), from the
summary the stage stores (``phase_summary``) to the report's section (``phases_section``).

The summary keeps the per-rank means, not every epoch's split (those stay in ``metrics.json``): a manifest's summary
is read whole by ``gnnpipe status`` and the flow, and 10 phases x ranks x epochs x 2 threads would dwarf the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storage.phases import PHASE_LABELS, PREFETCH_LABELS, clock_label, epochs_label, in_order, mean_phases
from storage.report import markdown_table, percent
from storage.train_summary import TrainSummary

PHASE_KEYS = ("phases_s", "prefetch_phases_s")   # the per-epoch records' phase splits (``storage.phases``)
_DIGITS = 4   # seconds in the summary: to 0.1 ms, finer than any phase boundary's cost


def epoch_table(epochs: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The summary's per-epoch rows: every figure of a record but its phase splits (``phase_summary`` holds their
    means), floats rounded."""
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in e.items() if k not in PHASE_KEYS}
            for e in epochs]


def phase_summary(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's phase figures: the clock, which epochs were averaged, and per phase, per rank the mean seconds
    per epoch of the model's thread (``phases_s``) and of the prefetch thread (``prefetch_phases_s``, absent
    without one); ``{}`` for metrics without phases (a build before the split)."""
    epochs = metrics.get("epochs") or []
    main = mean_phases(epochs)
    if main is None:
        return {}
    out: dict[str, Any] = {"phase_clock": metrics.get("phase_clock"), "phase_epochs": epochs_label(epochs),
                           "phases_s": _rounded(main)}
    prefetch = mean_phases(epochs, "prefetch_phases_s")
    if prefetch is not None:
        out["prefetch_phases_s"] = _rounded(prefetch)
    return out


def _rounded(phases: Mapping[str, list[float]]) -> dict[str, list[float]]:
    return {name: [round(v, _DIGITS) for v in values] for name, values in phases.items()}


def _rank_totals(phases: Mapping[str, list[float]]) -> list[float]:
    ranks = max((len(values) for values in phases.values()), default=0)
    return [sum(values[r] for values in phases.values() if r < len(values)) for r in range(ranks)]


def _share(values: list[float], totals: list[float]) -> float | None:
    """The mean over ranks of each rank's share of its own epoch (ranks with an empty pass left out)."""
    shares = [v / t for v, t in zip(values, totals) if t > 0]
    return sum(shares) / len(shares) if shares else None


def _rows(phases: Mapping[str, list[float]], totals: list[float], *, keep_zero: bool,
          labels: Mapping[str, str] = PHASE_LABELS) -> list[dict[str, Any]]:
    rows = []
    for name in in_order(phases):   # the summary's JSON has sorted them by name
        values = phases[name]
        if not keep_zero and not any(values):
            continue
        row: dict[str, Any] = {"phase": f"{labels.get(name, name)} (`{name}`)"}
        row.update({f"rank {r} s/epoch": v for r, v in enumerate(values)})   # 4 significant digits: a short epoch too
        row["share of the epoch"] = percent(_share(values, totals), 1)
        rows.append(row)
    return rows


def phases_section(t: TrainSummary) -> str:
    """The report's section: a table per phase of each rank's seconds per epoch and the mean share of the epoch
    (its training pass), the prefetch thread's in a second table; ``""`` for a build without phases."""
    main = t.phases_s
    if not main:
        return ""
    totals = _rank_totals(main)
    rows = _rows(main, totals, keep_zero=True)
    rows.append({"phase": "**training pass**", **{f"rank {r} s/epoch": v for r, v in enumerate(totals)},
                 "share of the epoch": percent(1.0 if any(totals) else None, 1)})
    shares = {name: _share(values, totals) or 0.0 for name, values in main.items()}
    top = max(shares, key=lambda name: shares[name])
    clock = ("CUDA events on the training stream (the device's timeline)" if t.phase_clock == "cuda_events"
             else f"the {clock_label(t.phase_clock)}")
    md = (f"\n### Where the time goes\n\nEach rank's training pass per epoch, split into exclusive phases timed by "
          f"{clock}: the mean of {t.phase_epochs}. The largest: {PHASE_LABELS.get(top, top)}, "
          f"{percent(shares[top], 1)} of the epoch. How to read it: README, \"Where the time goes\".\n\n"
          f"{markdown_table(rows)}\n")
    prefetch = t.prefetch_phases_s
    if prefetch:
        table = markdown_table(_rows(prefetch, totals, keep_zero=False, labels=PREFETCH_LABELS))
        md += ("\nThe prefetch thread's work, overlapping the model's thread (not part of the pass above; its share "
               f"is of the model's epoch):\n\n{table}\n")
    return md
