"""The phases a training pass's time is split into (``stages.runtime.phases`` measures them; the train report reads
them), in plotting order, and how the report averages them over epochs.

``metrics.json`` holds them (builds before the split lack every key: readers use ``.get`` and show nothing):

- ``phase_clock``: ``"cuda_events"`` (GPU ranks: CUDA events on the training stream, the device's timeline) or
  ``"wall_clock"`` (CPU ranks).
- per epoch ``phases_s``: ``{phase: [seconds on rank 0, rank 1, ...]}``, the model's thread's training pass split
  into exclusive phases (per rank they add up to its pass; ``other`` is the remainder), and ``prefetch_phases_s``, the
  same for the prefetch thread (work that overlaps the model's; ``{}`` without prefetch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PHASES = ("sample", "gather_cache", "gather_local", "gather_remote", "gather", "exchange", "forward_backward",
          "optimizer", "wait", "other")

# short labels for legends and tables, in users' words
PHASE_LABELS: dict[str, str] = {
    "sample": "sampling",
    "gather_cache": "gather: cache",
    "gather_local": "gather: local store",
    "gather_remote": "gather: remote rows",
    "gather": "gather: assembling",
    "exchange": "collective exchange",
    "forward_backward": "forward + backward",
    "optimizer": "optimiser step",
    "wait": "waiting for the batch",
    "other": "other",
}

# the prefetch thread's "wait" is its idle time, ahead of the model: the model has not yet asked for the next batch
PREFETCH_LABELS: dict[str, str] = {**PHASE_LABELS, "wait": "idle, ahead of the model"}
IDLE_COLOUR = "0.9"   # the prefetch thread's idle segment in the figure: no phase's colour (tab10 holds those)

CLOCK_LABELS: dict[str, str] = {"cuda_events": "CUDA events", "wall_clock": "wall clock"}


def clock_label(clock: str | None) -> str:
    """How the phases were timed, in words (a clock this code does not know by its stored name)."""
    return CLOCK_LABELS.get(clock or "", clock or "unknown clock")


def in_order(names: Iterable[str]) -> list[str]:
    """Phase names in plotting order: ``PHASES``' first, then any this code does not know, sorted (a split read back
    from JSON written with sorted keys has lost its order)."""
    names = set(names)
    return [p for p in PHASES if p in names] + sorted(names - set(PHASES))


def averaged_epochs(epochs: Sequence[Mapping[str, Any]], key: str = "phases_s") -> list[Mapping[str, Any]]:
    """The epoch records ``mean_phases`` averages: those whose ``key`` measured something (not absent, empty or all
    zero: an older build, no prefetch thread), less the first of them when there are 2 or more (its warm-up: the
    CUDA context, the allocator's first allocations and the caches' filling would be charged to the phases of that
    epoch alone)."""
    found = _measured(epochs, key)
    return found[1:] if len(found) >= 2 else found


def _measured(epochs: Sequence[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]]:
    return [e for e in epochs if any(v for values in (e.get(key) or {}).values() for v in values)]


def mean_phases(epochs: Sequence[Mapping[str, Any]], key: str = "phases_s") -> dict[str, list[float]] | None:
    """Per phase, per rank: the mean seconds per epoch over the epochs that hold ``key`` (``phases_s``, or
    ``prefetch_phases_s``), the first of them left out when there are 2 or more (warm-up: CUDA context, allocator,
    caches); None when no epoch measured it (an older build, or no prefetch thread).

    Every phase of ``PHASES`` is in the result, in that order (0 where a record lacks it), then any phase name this
    code does not know, so that nothing measured is dropped; ranks: the longest list of any record."""
    records = averaged_epochs(epochs, key)
    if not records:
        return None
    names = in_order({*PHASES, *(n for e in records for n in e[key])})
    ranks = max(len(values) for e in records for values in e[key].values())
    sums = {name: [0.0] * ranks for name in names}
    for e in records:
        for name, values in e[key].items():
            for rank, value in enumerate(values):
                sums[name][rank] += float(value or 0.0)
    return {name: [s / len(records) for s in per_rank] for name, per_rank in sums.items()}


def epochs_label(epochs: Sequence[Mapping[str, Any]], key: str = "phases_s") -> str:
    """Which epochs ``mean_phases`` averaged, 1-based as the report shows epochs: ``"epochs 2-10 (epoch 1 left out:
    warm-up)"``, ``"epoch 1"``, ``""`` when none."""
    found = _measured(epochs, key)
    used = averaged_epochs(epochs, key)
    if not used:
        return ""
    numbers = [int(e["epoch"]) + 1 for e in used]
    span = f"epoch {numbers[0]}" if len(numbers) == 1 else f"epochs {numbers[0]}-{numbers[-1]}"
    if len(numbers) > 1 and numbers != list(range(numbers[0], numbers[-1] + 1)):
        span = f"{len(numbers)} epochs of {numbers[0]}-{numbers[-1]}"   # a resumed run: epochs without phases
    if len(found) > len(used):
        span += f" (epoch {int(found[0]['epoch']) + 1} left out: warm-up)"
    return span
