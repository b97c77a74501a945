"""One training epoch and one evaluation pass over sampled batches, shared by the ``Trainer`` and the benchmark.

Nothing here knows about ranks or about the task: the caller hands in the batches of the task's items (node
gids, or positions of positive edges; equal counts on every rank for DDP), the two callables of the seam below
(``stages.train.rank.loader.NodeLoader`` holds a rank's: its distributed sampler, and the feature path of cache, store
and remote owners) and the ``Task`` (``stages.train.tasks``: a batch's seed nodes and targets, outputs, loss, metric
sums); sums come back for it to all-reduce (``stats``). Batches may be prepared ahead by a producer thread
(``prefetch``: ``stages.train.rank.prefetch``, whose rules the callables must follow) with the same results.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.phases import PhaseClock, measuring, phase
from stages.runtime.sums import RunningSums
from stages.train.rank.prefetch import batch_stream
from stages.train.tasks import Task

if TYPE_CHECKING:
    from stages.train.rank.graphed import GraphedStep

Sample = Callable[[Tensor], Data]          # seed gids -> sampled batch (n_id gids, seeds first)
# n_id gids -> [len, F] feature rows on the training device; a typed graph's per node type
GatherRows = Callable[[Tensor], Tensor | dict[str, Tensor]]
OnBatch = Callable[[int], None]            # called with the batch index before each batch


class CheckLoss(Protocol):
    """Sees every batch's loss before its backward pass, and the pass's end; raises to stop (``guard``)."""

    def __call__(self, batch: int, loss: Tensor) -> None: ...

    def finish(self) -> None: ...


@dataclass
class EpochSums:
    """Sums over the real (non-padding) batches of one rank, to all-reduce across ranks."""

    loss_sum: float = 0.0
    metric_sums: list[float] = field(default_factory=list)   # the task's, over the same seeds (``Task.sum_names``)
    seeds: int = 0            # what the loss is a mean over (``Task.size``: seed nodes, positive edges)
    batches: int = 0          # all batches run, padding included
    sampled_edges: int = 0    # all batches
    # rows gathered for the fake slots of a static sampler's batches (graphed_sampling), which the feature
    # counters counted: the trainer takes them back out
    padding_rows: int = 0
    wall_s: float = 0.0
    # seconds per phase of the pass (``stages.runtime.phases``; ``other``: the wall time not in any phase): the model's
    # thread, and the prefetch producer's (empty without one); not summed over ranks, each rank's is its own
    phases_s: dict[str, float] = field(default_factory=dict)
    prefetch_phases_s: dict[str, float] = field(default_factory=dict)
    phase_clock: str = "wall_clock"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rows(gather_rows: GatherRows, n_id: Tensor) -> Tensor | dict[str, Tensor]:
    x = gather_rows(n_id)
    if isinstance(x, dict):
        return {t: r if r.is_floating_point() else r.float() for t, r in x.items()}
    return x if x.is_floating_point() else x.float()


@dataclass
class Prepared:
    """One batch up to the model: the sampled blocks, their input rows and the task's target."""

    batch: Data
    x: Tensor | dict[str, Tensor]
    target: Any


def preparer(sample: Sample, gather_rows: GatherRows, task: Task, *, training: bool,
             pad: Callable[[Data, Any], Data] | None = None) -> Callable[[Tensor, Callable[[], None]], Prepared]:
    """``(item, before_gather) -> Prepared``: the task's seeds and target (negatives drawn and, filtered, asked of
    their owners), the sample (``pad``-ded with its target for a graphed step: ``graphed``), then
    ``before_gather()`` and the rows: the work a prefetching producer does."""
    def prepare(item: Tensor, before_gather: Callable[[], None]) -> Prepared:
        with phase("sample"):
            seed_gid, target = task.batch(item, training=training)
            batch = sample(seed_gid)
            if pad is not None:
                batch = pad(batch, target)
        before_gather()
        with phase("gather"):
            x = _rows(gather_rows, batch.n_id)
        return Prepared(batch, x, target)
    return prepare


def train_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed_batches: Iterable[Tensor],
                sample: Sample, gather_rows: GatherRows, task: Task, *, num_real_batches: int,
                device: torch.device, on_batch: OnBatch | None = None,
                check_loss: CheckLoss | None = None, after_step: Callable[[], None] | None = None,
                prefetch: int = 0, gather_after_step: bool = False, graph: GraphedStep | None = None) -> EpochSums:
    """Train on every batch of ``seed_batches``; loss and metric count only the first ``num_real_batches``.

    Padding batches (recycled seeds, or empty ones) still take an optimiser step: under DDP every rank must run
    the same number of backward passes, whose gradient all-reduces pair up across ranks. An empty batch gives a
    zero loss whose backward still reaches every parameter (zero gradients), so its rank joins each all-reduce.
    ``check_loss`` sees every batch's loss, padding included, before its backward pass, and the pass's end
    (``stages.train.rank.guard``, which may raise for a batch one step late);
    ``after_step`` runs after every optimiser step (the learnt embeddings' sparse step, a collective).
    ``prefetch``: batches a producer thread prepares ahead (0: none); ``gather_after_step``: it gathers a batch's
    rows only after the previous batch's ``after_step`` (which updates rows it may gather: learnt embeddings).
    ``graph``: each step is a replay of a captured CUDA graph on padded batches (``graphed``; then ``model`` and
    ``optimizer`` are the graph's, ``check_loss`` sees each loss after its step and ``after_step`` must be None).
    """
    model.train()
    sums = EpochSums(metric_sums=[0.0] * len(task.sum_names))
    running = RunningSums(1 + len(task.sum_names))   # the loss sum, then the task's: read once, at the end
    counts = RunningSums(2)   # every batch's sampled edges and padding rows (device counts under a static sampler)
    clock = PhaseClock(device)
    start = time.perf_counter()
    with measuring(clock):
        prepare = preparer(sample, gather_rows, task, training=True, pad=None if graph is None else graph.pad)
        stream = batch_stream(seed_batches, prepare, depth=prefetch, device=device,
                              gather_after_step=gather_after_step)
        with stream:
            batches = iter(stream)
            for b in itertools.count():
                with phase("wait"):   # prefetch: the producer's lag; else the batch is prepared in here
                    ready = next(batches, None)
                if ready is None:
                    break
                if graph is not None:
                    _graphed_step(b, ready, graph, task, sums, (running, counts), on_batch=on_batch,
                                  check_loss=check_loss, real=b < num_real_batches)
                    continue
                _train_step(b, ready, model, optimizer, task, sums, (running, counts), on_batch=on_batch,
                            check_loss=check_loss, after_step=after_step, real=b < num_real_batches)
            if check_loss is not None:
                check_loss.finish()
    sums.loss_sum, *sums.metric_sums = running.values()
    sums.sampled_edges, sums.padding_rows = (int(v) for v in counts.values())
    _sync(device)
    sums.wall_s = time.perf_counter() - start
    sums.phases_s = clock.totals()
    sums.phases_s["other"] = max(0.0, sums.wall_s - sum(sums.phases_s.values()))
    sums.prefetch_phases_s = stream.producer_phases() or {}
    sums.phase_clock = clock.kind
    return sums


def _train_step(b: int, ready: Prepared, model: torch.nn.Module, optimizer: torch.optim.Optimizer, task: Task,
                sums: EpochSums, running: tuple[RunningSums, RunningSums], *, on_batch: OnBatch | None,
                check_loss: CheckLoss | None, after_step: Callable[[], None] | None, real: bool) -> None:
    """One batch's model work, the step and the sums (``real``: a batch whose loss and metric count)."""
    if on_batch is not None:
        on_batch(b)
    y = ready.target
    with phase("optimizer"):   # zeroed before the forward pass, which reads no gradient: the same results
        optimizer.zero_grad(set_to_none=True)
    with phase("forward_backward"):
        out = task.forward(model, ready.x, ready.batch, y)
        loss = task.loss(out, y)
        if check_loss is not None:
            check_loss(b, loss)
        loss.backward()
    with phase("optimizer"):
        optimizer.step()
        if after_step is not None:
            after_step()
    _count_batch(sums, running, task, out, y, loss, int(ready.batch.edge_index.shape[1]), 0, real=real)


def _graphed_step(b: int, ready: Prepared, graph: GraphedStep, task: Task, sums: EpochSums,
                  running: tuple[RunningSums, RunningSums], *, on_batch: OnBatch | None,
                  check_loss: CheckLoss | None, real: bool) -> None:
    """``_train_step`` through ``graph``: the step on the padded batch, the sums over its real seeds."""
    if on_batch is not None:
        on_batch(b)
    batch, x, y = ready.batch, ready.x, ready.target
    assert isinstance(x, Tensor), "a graphed step's graph has one node type (graphed.why_not_graphed)"
    with phase("forward_backward"):   # the optimiser's step is inside the graph
        out, loss = graph(batch, x)
    if check_loss is not None:
        check_loss(b, loss)
    # a static sampler's counts are device tensors, added on the device (no read a batch)
    _count_batch(sums, running, task, out[:batch.real_batch_size], y, loss, batch.real_edges,
                 getattr(batch, "padding_rows", 0), real=real)


def _count_batch(sums: EpochSums, running: tuple[RunningSums, RunningSums], task: Task, out: Any, y: Any,
                 loss: Tensor, sampled_edges: int | Tensor, padding_rows: int | Tensor, *, real: bool) -> None:
    """A stepped batch in the pass's sums (``running``: the loss and metric sums, then the counts); its loss and
    metric only when ``real``."""
    sums.batches += 1
    running[1].add([sampled_edges, padding_rows])
    if real:   # on the device, no synchronisation: the float64 loss times the count is what float() * n was
        size = task.size(y)
        running[0].add([loss.detach().to(torch.float64) * size, *task.metric_sums(out, y)])
        sums.seeds += size


@torch.no_grad()
def eval_sums(model: torch.nn.Module, seed_batches: Iterable[Tensor], sample: Sample, gather_rows: GatherRows,
              task: Task, *, prefetch: int = 0, device: torch.device | None = None) -> list[float]:
    """The task's metric sums over all batches (this rank's; the caller all-reduces). Empty batches still sample
    and gather (those are collectives in the distributed runtime) but skip the model, which has no collective
    outside DDP's backward. ``prefetch`` as in ``train_epoch``; ``device``: the model's (default CPU). A static
    sampler's padded batches (``graphed_sampling``) are computed whole and scored on their real seeds."""
    model.eval()
    sums = RunningSums(len(task.sum_names))
    # task.batch is a collective for some tasks (filtered negatives): every batch is prepared, empty ones too
    stream = batch_stream(seed_batches, preparer(sample, gather_rows, task, training=False), depth=prefetch,
                          device=device or torch.device("cpu"))
    with stream:
        for ready in stream:
            if task.size(ready.target) == 0:
                continue
            out = task.forward(model, ready.x, ready.batch, ready.target)
            if getattr(ready.batch, "static", False):   # a static sampler's padded batch: its real seeds' rows
                out = out[:ready.batch.real_batch_size]
            sums.add(task.metric_sums(out, ready.target))
    return sums.values()
