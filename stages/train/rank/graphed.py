"""The training step as one captured CUDA graph (``cuda_graph=step`` or ``auto``): the host launches a whole step,
forward, backward and Adam, with one call instead of ~94 ops (issue [4/5] item 3: a products batch on one GPU is
launch-bound; benchmarks/RESULTS.md, "[4/5] Launches and host reads a batch").

A graph replays fixed tensor sizes at fixed addresses. So each batch is padded to the pass's static shape
(``stages.train.rank.static_batch``) by the producer, after sampling and before the gather (or sampled so, by a
static sampler's graph under ``auto``: ``graphed_sampling``), and the step copies its
edges, rows and labels into buffers made at the first batch: three copies, then the replay. The first batches of a
rank's first pass run eagerly on those buffers (lazy initialisations, e.g. cuBLAS's workspace and Adam's state,
must happen outside a capture); the next one is captured, and each later batch replays it, in later passes too.
The trainer captures anew when the learning rate changed (a capture bakes it in) or a checkpoint's load replaced
Adam's state tensors. A capture that fails while CUDA still ends it cleanly (out of memory, a Python error in the
step) costs only the attempt: the run goes on eagerly, and its report says why. One that CUDA invalidated (an op
that cannot be captured: a host read, a synchronisation) stops the rank with one line naming ``cuda_graph=off``:
PyTorch (2.11, what the GPU machines run) does not undo such a capture: the allocator keeps it registered as
underway (so it defers freeing every block used on two streams, a prefetched batch each, for good) and the random
generators stay mid-capture, refusing eager draws (``CaptureBrokenError``).

What may be graphed (``why_not_graphed``): a lone CUDA rank (no DDP all-reduce in the step), a task whose labels
may be padded (``Task.pads_labels``: node classification with cross-entropy, whose ``ignore_index`` keeps the fake
seeds out of the mean), the built-in SAGE on its sparse path in float32 or tf32, positive fanouts (a bound per
hop), one node and edge type, no edge features. Anything else trains eagerly, and the report says why. Adam is made
``capturable`` for it.

The results are those of the eager step on the padded batch: the same losses and gradients as the unpadded batch
up to the order of additions (tested), except dropout, whose masks are drawn over the padded rows: another draw
of the same law, reproducible for the same settings. The loss guard sees each batch's loss after its step, as it
does anyway (it reads one batch late: ``guard``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.sampling.static_shape import StaticShape
from stages.train.rank.static_batch import pad_batch, pad_labels
from stages.train.rank.streams import STEP_CAPTURE, STEP_WARMUP, on_role_stream, role_stream
from storage.errors import GnnpipeError

__all__ = ["CaptureBrokenError", "CudaGraphOf", "GraphedStep", "StepGraph", "why_not_graphed"]

Outputs = tuple[Tensor, Tensor]   # the padded seeds' logits and the batch's mean loss, detached
WARMUP_STEPS = 2                  # eager steps before the first capture of a rank (PyTorch's CUDA graph notes)


class StepGraph(Protocol):
    """A captured step: ``replay()`` runs it on the buffers' current contents and returns its outputs."""

    def replay(self) -> Outputs: ...


class CaptureBrokenError(GnnpipeError):
    """CUDA rejected a capture at its end (``cudaStreamEndCapture``): PyTorch then leaves the capture registered with
    the allocator as underway and the generators mid-capture (fixed upstream after 2.11: pytorch#180395, #190308),
    so nothing after it in this process can be trusted to run. One line naming the setting that avoids it."""


class CudaGraphOf:
    """``fn`` captured into a ``torch.cuda.CUDAGraph``: ``replay()`` reruns it and returns its outputs, tensors that
    each replay overwrites. ``generator``: a non-default CUDA generator ``fn`` draws from, registered with the graph
    (each replay then advances it); ``stream``: the capture's, a role's own (``stages.train.rank.streams``; None
    would be PyTorch's shared capture stream, a pool stream that a later draw can hand to another thread)."""

    def __init__(self, fn: Callable[[], Any], *, stream: torch.cuda.Stream | None,
                 generator: torch.Generator | None = None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        if generator is not None and generator.device.type == "cuda":
            self.graph.register_generator_state(generator)
        # an earlier step's asynchronous error (a device-side assert) surfaces here as itself, not in the capture's
        # entry (which synchronises first) where it would read as a capture failure with the wrong advice
        torch.cuda.synchronize()
        current = torch.cuda.current_stream()
        failed: Exception | None = None   # fn's own error, raised once the capture has ended (cleanly or not)
        try:
            # thread_local: the prefetch producer keeps sampling (allocating, reading sizes) on its own stream during
            # the capture; under the default global mode any such call in another thread fails the capture
            with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
                try:
                    self.outputs = fn()
                except Exception as error:  # noqa: BLE001 - held until the capture's end says whether it is clean
                    failed = error
        except Exception as end_error:   # the end raised before the context gave the stream back
            torch.cuda.set_stream(current)
            cause = first_line(failed if failed is not None else end_error)
            raise CaptureBrokenError(f"a CUDA graph capture failed ({cause}), which leaves CUDA unusable in this "
                                     f"process: set cuda_graph=off and rerun") from end_error
        if failed is not None:   # ended cleanly (the allocator and generators restored): only this attempt is lost
            raise failed

    def replay(self) -> Any:
        self.graph.replay()
        return self.outputs


class GraphedStep:
    """A rank's training steps through a captured graph, for as long as the trainer keeps it (module docstring).
    ``pad`` is the producer's half (``stages.train.rank.loop.preparer``); calling it with a prepared padded batch
    is the step's."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, task: Any, shape: StaticShape,
                 device: torch.device, *, warmup: int = WARMUP_STEPS,
                 capture: Callable[[Callable[[], Outputs]], StepGraph] | None = None) -> None:
        """``capture``: makes the ``StepGraph`` of a step (default ``CudaGraphOf`` on the rank's step-capture
        stream, ``stages.train.rank.streams``)."""
        self.model, self.optimizer, self.task, self.shape = model, optimizer, task, shape
        self.device, self.warmup = device, warmup
        self.lr = float(optimizer.param_groups[0]["lr"])   # what a capture bakes in (a scheduler changes it)
        self.capture = capture if capture is not None else self._capture
        self.fake_edges = shape.fake_edge_index(device)
        self.graph: StepGraph | None = None
        self.failed: str | None = None   # why the capture failed (then every step is eager)
        self.eager_steps = 0
        self._x: Tensor | None = None
        self._batch: Data | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def pad(self, batch: Data, target: Tensor) -> Data:
        """The producer's half: ``batch`` padded to the static shape (unless a static sampler's, ``static``, sampled
        it so: ``graphed_sampling``), its labels ``target`` as ``y``."""
        padded = batch if getattr(batch, "static", False) else pad_batch(batch, self.shape, self.fake_edges)
        padded.y = pad_labels(target, self.shape.nodes[0])
        return padded

    def __call__(self, batch: Data, x: Tensor) -> Outputs:
        """One step on a padded ``batch`` (``pad``) and the rows ``x`` of its real nodes (every slot's, for a static
        sampler's batch, which has no ``pad_pos``)."""
        self._load(batch, x)
        if self.graph is None:
            if self.eager_steps < self.warmup or self.failed is not None:
                self.eager_steps += 1
                return self._eager()
            try:
                self.graph = self.capture(self._step)
            except CaptureBrokenError:   # nothing eager can follow it in this process
                raise
            except Exception as error:   # noqa: BLE001 - a capture that ended cleanly: the step runs eagerly
                # a capture runs nothing (the gradients it set to None are set again by the next step), so the
                # batch is stepped eagerly, and so are the pass's others; the trainer reports why
                self.failed = f"the capture failed: {first_line(error)}"
                print(f"cuda_graph: {self.failed}; training eagerly", flush=True)
                return self._eager()
        return self.graph.replay()

    def _capture(self, step: Callable[[], Outputs]) -> StepGraph:
        """``step`` captured on the rank's own capture stream (``stages.train.rank.streams``), not PyTorch's shared
        one; a CPU test's stand-in for ``CudaGraphOf`` is given none."""
        stream = role_stream(STEP_CAPTURE, self.device) if self.device.type == "cuda" else None
        return CudaGraphOf(step, stream=stream)

    def _load(self, batch: Data, x: Tensor) -> None:
        if self._x is None or self._batch is None:
            # zeros: a fake node's row is finite from the first batch on (static_batch's docstring)
            self._x = x.new_zeros((self.shape.num_nodes, x.shape[1]))
            self._batch = Data(edge_index=batch.edge_index.clone(), y=batch.y.clone(), batch_size=batch.batch_size,
                               num_nodes=batch.num_nodes, num_sampled_nodes=batch.num_sampled_nodes,
                               num_sampled_edges=batch.num_sampled_edges, edges_by_target=True)
        else:
            self._batch.edge_index.copy_(batch.edge_index)
            self._batch.y.copy_(batch.y)
        if getattr(batch, "pad_pos", None) is None:
            self._x.copy_(x)
        else:
            self._x.index_copy_(0, batch.pad_pos, x)

    def _step(self) -> Outputs:
        """The step on the buffers: zero_grad(set_to_none) makes the backward write fresh gradients, which in a
        graph are the graph's own tensors, written again by each replay (PyTorch's whole-network capture)."""
        assert self._x is not None and self._batch is not None
        self.optimizer.zero_grad(set_to_none=True)
        out = self.task.forward(self.model, self._x, self._batch, self._batch.y)
        loss = self.task.loss(out, self._batch.y)
        loss.backward()
        self.optimizer.step()
        return out.detach(), loss.detach()

    def _eager(self) -> Outputs:
        # on a side stream, as a capture's warm-up must be (one for every step: its freed blocks are reused)
        with on_role_stream(STEP_WARMUP, self.device):
            return self._step()


def first_line(error: BaseException) -> str:
    """An error in a report's words: its type and its message's first line (200 characters at most)."""
    message = str(error)
    return f"{type(error).__name__}: {message.splitlines()[0][:200] if message else ''}"


def graphable_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` is the built-in SAGE on its sparse path (``BlockGraphSAGE.block_step``): ReLU, no norms,
    mean aggregation with a root weight; its step has no host read and no data-sized shape."""
    from stages.train.models.model import BlockGraphSAGE

    if type(model) is not BlockGraphSAGE or not model.supports_blocks:   # a subclass may change the step
        return False
    plain = isinstance(model.act, torch.nn.ReLU) and all(isinstance(n, torch.nn.Identity) for n in model.norms)
    return plain and all(c.aggr == "mean" and not c.project and not c.normalize and c.root_weight
                         for c in model.convs)


def why_not_graphed(setting: str, *, device: torch.device, world: int, task: Any, loss: str, precision: str,
                    model: torch.nn.Module, fanouts: Sequence[Any], typed: bool, edge_features: bool) -> str | None:
    """None when a rank's training step can be a CUDA graph under ``cuda_graph=setting``, else why not (the
    report's words; module docstring). ``task``: the rank's ``Task``; ``loss``: its loss's name."""
    reasons = [
        *_rank_reasons(setting, device, world),
        (not getattr(task, "pads_labels", False), f"{task.name} with loss {loss} (the fake seeds' labels must count "
                                                  f"in no loss: cross_entropy's ignore_index)"),
        *_batch_reasons(precision, typed, edge_features, fanouts),
        (not graphable_model(model), "a model other than the built-in SAGE with ReLU and no norm"),
    ]
    return next((why for hit, why in reasons if hit), None)


def why_not_graphed_setup(setting: str, *, device: torch.device, world: int, precision: str,
                          fanouts: Sequence[Any], typed: bool, edge_features: bool) -> str | None:
    """``why_not_graphed``'s reasons that are known before the rank's task and model are built: what the device
    budget reads (``cache_budget.DeviceShare.graphed``) to reserve a graph's second batch only where one may be."""
    reasons = [*_rank_reasons(setting, device, world), *_batch_reasons(precision, typed, edge_features, fanouts)]
    return next((why for hit, why in reasons if hit), None)


def _rank_reasons(setting: str, device: torch.device, world: int) -> list[tuple[bool, str]]:
    return [(setting == "off", "cuda_graph=off"), (device.type != "cuda", "a CPU rank"),
            (world > 1, "several ranks (DDP's all-reduces are in the step)")]


def _batch_reasons(precision: str, typed: bool, edge_features: bool,
                   fanouts: Sequence[Any]) -> list[tuple[bool, str]]:
    return [(precision not in ("float32", "tf32"), f"precision={precision}"), (typed, "a typed graph"),
            (edge_features, "edge features"),
            (any(not isinstance(f, int) or f <= 0 for f in fanouts), "fanout -1 or per edge type (no static bound)")]
