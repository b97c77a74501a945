"""Prefetch (docs/design.md §5): while the model computes batch b, a producer thread prepares batch b + 1.

A pass (a training epoch, a validation or a test pass) reads its batches from a ``BatchStream``: each batch is
``prepare(item, before_gather)`` -- everything before the model (the task's seeds and targets, which may draw
negatives and ask their owners about them; the sampled blocks; the gathered rows) -- and the model's work follows
in the caller's thread. ``batch_stream(depth=0)`` prepares each batch when the caller asks for it (the synchronous
path); ``depth >= 1`` starts a producer thread that runs up to ``depth`` batches ahead of the caller.

The rules that keep the prefetching path's batches bit-identical to the synchronous one's and every rank in
lockstep:

- **one process group per thread.** Collectives on one group must be called in the same order on every rank. The
  producer's collectives (sampling, the feature and degree exchanges, filtered negatives, the learnt embeddings'
  gathers) run on the producer's own group (``producer_group``, made by every rank in the same order), the main
  thread's (DDP's all-reduces, the loss guard, the metric sums, the embeddings' sparse step) on the default group:
  each group then sees one thread's calls, in program order.
- **random streams.** The producer draws only from the generators of the shuffle and the sampler, which the main
  thread does not touch during a pass (dropout draws from torch's global one), so every batch draws what it draws
  on the synchronous path.
- **no prefetch across a pass.** The producer ends with its pass (its items run out), so each generator's state at
  the pass's end, and in every checkpoint, is the synchronous path's.
- **learnt embeddings.** The sparse step after batch b updates rows that batch b + 1 may gather. With
  ``gather_after_step`` the producer samples batch b + 1 ahead but gathers its rows only once the caller has asked
  for batch b + 1 (so b's step is done): the rows equal the synchronous path's.
- **failures.** An exception in the producer is raised in the caller's thread when it asks for the batch; a caller
  that stops (an exception, or leaving the pass) stops the producer before its next batch.

CUDA: the producer runs on a side stream; the caller's stream waits on the event recorded after each batch's
preparation, and the batch's tensors are ``record_stream``-ed onto the caller's stream so the allocator does not
hand their memory back to the side stream while the model still reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data.data import BaseData

from stages.runtime.phases import PhaseClock, current_clock, measuring, phase
from stages.train.rank.streams import PREFETCH, role_stream

# (item, before_gather) -> a prepared batch; ``before_gather()`` is called after sampling, before the rows' gather
Prepare = Callable[[Tensor, Callable[[], None]], Any]

_POLL_S = 0.1   # how often a waiting producer looks whether the caller has stopped
_STOP_JOIN_S = 5.0   # a stopped producer blocked in a collective is left behind (a daemon) after this long


def producer_group(depth: int) -> dist.ProcessGroup | None:
    """The producer's process group when prefetching (every rank, gloo), else None (the default group). A
    collective: every rank calls it, with the same ``depth``, in the same order among its other groups.

    gloo also beside a NCCL default group: NCCL documents that communicators used concurrently can deadlock (its
    kernels block while waiting for peers; "Using multiple NCCL communicators concurrently" in its user guide),
    and the producer's exchanges run while DDP's all-reduces do. Its exchanges then travel through the host
    (``collectives.comm_device``): ids and counts, and the remote feature rows.
    """
    if depth <= 0 or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.new_group(backend="gloo")


def batch_stream(items: Iterable[Tensor], prepare: Prepare, *, depth: int, device: torch.device,
                 gather_after_step: bool = False) -> BatchStream:
    """The prepared batches of ``items``, in order: synchronous at ``depth`` 0, else prefetched by a thread."""
    if depth <= 0:
        return BatchStream(items, prepare)
    return PrefetchStream(items, prepare, depth=depth, device=device, gather_after_step=gather_after_step)


class BatchStream:
    """Each batch prepared in the caller's thread when asked for (the synchronous path). Use it as a context
    manager around the pass: leaving it stops whatever still runs."""

    def __init__(self, items: Iterable[Tensor], prepare: Prepare) -> None:
        self._items, self._prepare = items, prepare

    def __iter__(self) -> Iterator[Any]:
        for item in self._items:
            yield self._prepare(item, _nothing)

    def close(self) -> None:
        """Stop preparing batches (nothing to stop here)."""

    def producer_phases(self) -> dict[str, float] | None:
        """Seconds per phase of the producer thread's pass (after the pass), or None: no producer, or nothing
        measured (no clock was current where the stream was made)."""
        return None

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _nothing() -> None:
    pass


@dataclass
class _Ready:
    batch: Any
    done: torch.cuda.Event | None   # CUDA: recorded on the side stream after the batch's preparation


@dataclass
class _Failed:
    error: BaseException


_END = object()


class PrefetchStream(BatchStream):
    """Batches prepared by a producer thread, at most ``depth`` ahead of the one the caller is working on."""

    def __init__(self, items: Iterable[Tensor], prepare: Prepare, *, depth: int, device: torch.device,
                 gather_after_step: bool) -> None:
        super().__init__(items, prepare)
        self.depth, self.device, self.gather_after_step = depth, device, gather_after_step
        self._ready: queue.Queue[Any] = queue.Queue()
        self._progress = threading.Condition()
        self._asked = 0          # batches the caller has asked for: those before the last one are done with
        self._stopping = False
        self._cuda = device.type == "cuda"
        # the producer thread starts on device 0: name the caller's device by index ("cuda" alone has none)
        self._device_index: int | None = None
        if self._cuda:
            self._device_index = device.index if device.index is not None else torch.cuda.current_device()
        self._side = role_stream(PREFETCH, device) if self._cuda else None
        if self._side is not None:   # what the caller queued before the pass (a cache build, restored embedding
            self._side.wait_stream(torch.cuda.current_stream(device))   # rows) is done before the producer reads it
        self._released: torch.cuda.Event | None = None   # CUDA: recorded on the caller's stream when it asks
        # the producer computes in the caller's grad mode (a learnt embedding's gathered rows are leaves that require
        # grad only in training); grad mode is per thread, the intra-op thread count is the process's
        self._grad = torch.is_grad_enabled()
        self._thread = threading.Thread(target=self._produce, name="gnnpipe-prefetch", daemon=True)
        self._started = False
        # the producer's own phases when the caller measures its pass (stages.runtime.phases): overlapped work
        self._clock = PhaseClock(device) if current_clock() is not None else None

    # ---- the caller's side ------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if not self._started:
            self._started = True
            self._thread.start()
        while True:
            with self._progress:
                self._asked += 1
                if self._cuda:
                    self._released = torch.cuda.Event()
                    self._released.record()   # the caller's work on the batches before this one is queued
                self._progress.notify_all()
            got = self._ready.get()
            if got is _END:
                self._thread.join()
                return
            if isinstance(got, _Failed):
                self._thread.join()
                raise got.error
            if got.done is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(got.done)
                for tensor in _tensors(got.batch):
                    if tensor.is_cuda:
                        tensor.record_stream(stream)
            yield got.batch

    def close(self) -> None:
        """Stop the producer before its next batch and wait for it; a producer blocked inside a collective (a peer
        that failed) is left to the collective's timeout after ``_STOP_JOIN_S``."""
        with self._progress:
            self._stopping = True
            self._progress.notify_all()
        if self._started and self._thread.is_alive():
            self._thread.join(_STOP_JOIN_S)

    def producer_phases(self) -> dict[str, float] | None:
        if self._clock is None or self._thread.is_alive():
            return None
        return self._clock.totals()

    # ---- the producer's side ----------------------------------------------------------------------------------
    def _produce(self) -> None:
        torch.set_grad_enabled(self._grad)
        with measuring(self._clock):
            self._produce_measured()

    def _produce_measured(self) -> None:
        try:
            if self._cuda:
                torch.cuda.set_device(self._device_index)
                with torch.cuda.stream(self._side):
                    self._produce_all()
            else:
                self._produce_all()
        except BaseException as error:  # noqa: BLE001 - whatever stops the producer is the caller's to raise
            self._ready.put(_Failed(error))
            return
        self._ready.put(_END)

    def _produce_all(self) -> None:
        for b, item in enumerate(self._items):
            # batch b starts once the caller asked for batch b - depth (works on it, or on a later one)
            if not self._wait_asked(b + 1 - self.depth):
                return
            batch = self._prepare(item, functools.partial(self._before_gather, b))
            done = None
            if self._side is not None:
                done = torch.cuda.Event()
                done.record(self._side)
            self._ready.put(_Ready(batch, done))

    def _before_gather(self, b: int) -> None:
        """With ``gather_after_step``: wait until the caller asked for batch b, i.e. finished b - 1 (its step)."""
        if not self.gather_after_step:
            return
        if not self._wait_asked(b + 1):
            raise _StoppedError
        with self._progress:
            released = self._released
        if self._side is not None and released is not None:
            self._side.wait_event(released)   # the step's kernels, queued on the caller's stream

    def _wait_asked(self, count: int) -> bool:
        """Wait until the caller has asked for ``count`` batches; False once it stops."""
        with phase("wait"), self._progress:
            while self._asked < count and not self._stopping:
                self._progress.wait(_POLL_S)
            return not self._stopping


class _StoppedError(Exception):
    """The caller stopped while the producer waited inside a batch's preparation (raised nowhere else)."""


def _tensors(value: Any) -> Iterator[Tensor]:
    """Every tensor inside a prepared batch: tensors, PyG ``Data``, mappings, sequences and dataclasses of them."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, BaseData):
        yield from _tensors(value.to_dict())
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name))
