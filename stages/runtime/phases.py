"""Where a training pass's time goes: each thread's time split into exclusive, named phases (issue [4/5] item 5).

A ``PhaseClock`` is made for one pass and made current in one thread (``measuring``); code anywhere below it marks
what it is doing with ``phase(name)``, which costs nothing where no clock is current (evaluation, inference, the
tests that call the runtime directly). The innermost open phase is charged: a collective inside the feature
gather charges ``exchange``, not ``gather_remote``, so the phases never overlap and add up to the thread's time.

Two clocks, one contract (``totals()``: seconds per phase):

- CPU ranks: wall clock (``time.perf_counter``) at each phase boundary.
- CUDA ranks: a timing CUDA event recorded on the thread's current stream at each boundary, read once at the end
  of the pass: no host-device synchronisation inside the batch path (the profile of issue [4/5] counts 64 a batch
  already). The split is then of the device's timeline: a phase lasts from the moment the device reached its first
  mark to the moment it reached the next, so a host-bound rank (the device waiting for launches) shows that
  overhead inside the phase whose work the host was launching.

The names, their order and what each covers are in ``storage.phases`` (``PHASES``; the report reads them there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

import torch

from storage.phases import PHASES

_current = threading.local()
_FOLD_EVERY = 8192   # CUDA intervals kept before the oldest are read (a wait on events long past): ~400 batches


def clock_kind(device: torch.device) -> str:
    """What a pass on ``device`` is timed with: ``cuda_events`` or ``wall_clock`` (metrics.json's ``phase_clock``)."""
    return "cuda_events" if device.type == "cuda" else "wall_clock"


class PhaseClock:
    """Exclusive phase times of one thread. ``device``: CUDA events on a CUDA device, wall clock otherwise."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = clock_kind(device)
        self._open: list[str] = []                        # the phases entered and not left, innermost last
        self._last: float | torch.cuda.Event | None = None
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []   # CUDA: unread intervals

    def enter(self, name: str) -> None:
        self._boundary()
        self._open.append(name)

    def leave(self) -> None:
        self._boundary()
        self._open.pop()

    def _boundary(self) -> None:
        """Charge the time since the last boundary to the innermost open phase."""
        if not self.cuda:
            now = time.perf_counter()
            if self._open and isinstance(self._last, float):
                self._seconds[self._open[-1]] += now - self._last
            self._last = now
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if self._open and isinstance(self._last, torch.cuda.Event):
            self._pending.append((self._open[-1], self._last, event))
            if len(self._pending) >= _FOLD_EVERY:
                self._fold(self._pending[: _FOLD_EVERY // 2])
                del self._pending[: _FOLD_EVERY // 2]
        self._last = event

    def _fold(self, intervals: list[tuple[str, torch.cuda.Event, torch.cuda.Event]]) -> None:
        if intervals:
            intervals[-1][2].synchronize()   # the last recorded on this stream: every earlier one is done too
        for name, start, end in intervals:
            self._seconds[name] += start.elapsed_time(end) / 1e3

    def totals(self) -> dict[str, float]:
        """Seconds per phase (every name of ``PHASES``; ``other`` stays 0 here: the caller knows the wall time)."""
        self._fold(self._pending)
        self._pending = []
        return dict(self._seconds)


class _Phase:
    """``with phase(name):`` — a class rather than a generator: entered around every batch's steps, it should cost
    little (about 1 µs) where no clock is current."""

    __slots__ = ("clock", "name")

    def __init__(self, name: str) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; choose from {', '.join(PHASES)}")
        self.name = name
        self.clock: PhaseClock | None = None

    def __enter__(self) -> None:
        self.clock = getattr(_current, "clock", None)
        if self.clock is not None:
            self.clock.enter(self.name)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.clock is not None:
            self.clock.leave()


def phase(name: str) -> _Phase:
    """Charge what runs inside to phase ``name`` on this thread's current clock (if any)."""
    return _Phase(name)


def current_clock() -> PhaseClock | None:
    """This thread's current clock, or None."""
    return getattr(_current, "clock", None)


@contextmanager
def measuring(clock: PhaseClock | None) -> Iterator[PhaseClock | None]:
    """Make ``clock`` this thread's current one for the block (None: measure nothing), then restore the last."""
    before = getattr(_current, "clock", None)
    _current.clock = clock
    try:
        yield clock
    finally:
        _current.clock = before
