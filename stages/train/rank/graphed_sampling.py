"""The producer's half of a graphed training step as one captured CUDA graph too (``cuda_graph=auto``): a batch's
whole sampling, with no host read (``stages.runtime.sampling.static_sampler``), replayed per batch.

With the step graphed (``stages.train.rank.graphed``), the prefetch thread's eager sampling set the pace of a
1-GPU products epoch: ~166 launches and 6 host reads a batch (``benchmarks/RESULTS.md``, [4/5]). Here the host
copies the batch's seeds into a buffer, replays one graph, and clones its three outputs (the static sampler's
buffers are the next batch's), ~7 launches and no read.

The graph is captured before the rank's first graphed pass, in the training thread, after ``WARMUP_STEPS`` eager
runs on a batch of no seeds (lazy initialisations must happen outside a capture). So the prefetch thread only
ever replays it, and no two captures run at once. The warm-up and the capture draw from the sampler's generator,
whose state is put back afterwards: a pass's batches draw what an eager static sampler's would, on any device.
A capture that fails but ends cleanly leaves the static sampler running eagerly (still no host read), and the
report says why; one that CUDA invalidated stops the rank (``graphed.CaptureBrokenError``).

The rank's evaluation passes sample through the same graph (their batches are seeds of one split too, checked
once by the loader), the model computing eagerly on the padded batch and its real seeds' outputs kept
(``loop.eval_sums``).

What may be graphed (``why_not_graphed_sampling``): a graphed step whose rank holds every feature row on its
device (the gather of a padded ``n_id`` is then one ``index_select``, with no read), and a CSR the static sampler
takes (``stages.runtime.sampling.static_sampler.why_not_static``).

Feature counters: the gather reads every padded slot's row (a fake slot's is gid 0's, which no real node reads),
so the pass subtracts the fake slots (``padding_rows``, kept on the device) from its counters at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.static_sampler import StaticBatch, StaticSampler, why_not_static
from stages.runtime.sampling.static_shape import StaticShape
from stages.train.rank.graphed import WARMUP_STEPS, CaptureBrokenError, CudaGraphOf, first_line
from stages.train.rank.streams import SAMPLING_CAPTURE, SAMPLING_WARMUP, on_role_stream, role_stream

__all__ = ["SampleGraph", "why_not_graphed_sampling"]

Capture = Callable[[Callable[[], StaticBatch], "torch.Generator | None"], Any]   # -> an object with replay()


class SampleGraph:
    """A rank's batches sampled by ``sampler`` through one captured graph (module docstring). ``__call__(seed_gid)``
    is the loop's ``Sample`` on a padded batch's way: a ``Data`` in the static shape."""

    def __init__(self, sampler: StaticSampler, *, warmup: int = WARMUP_STEPS, capture: Capture | None = None) -> None:
        """``capture(fn, generator)``: an object whose ``replay()`` reruns ``fn`` and returns its outputs (default:
        ``CudaGraphOf``, with ``generator`` registered on the graph)."""
        self.sampler, self.warmup = sampler, warmup
        self.shape: StaticShape = sampler.shape
        device = sampler.device
        self.seed_buf = torch.zeros(sampler.capacity[0], dtype=torch.long, device=device)
        self.num_seeds = torch.zeros((), dtype=torch.long, device=device)
        self.capture = capture if capture is not None else _cuda_capture
        self.graph: Any = None
        self.failed: str | None = None     # why the capture failed (then the static sampler runs eagerly)
        self.unusable: str | None = None   # why the static sampler itself failed (then the eager sampler runs)
        self.prepared = False

    def prepare(self) -> bool:
        """Warm up and capture (on a batch of no seeds: the same kernels on the same sizes), leaving the generator
        as it was. False when the warm-up itself failed (``unusable`` says why): the rank then samples eagerly."""
        if self.prepared:
            return self.unusable is None
        self.prepared = True
        generator = self.sampler.generator
        state = generator.get_state() if generator is not None else None
        self._load(self.seed_buf[:0])
        try:
            with on_role_stream(SAMPLING_WARMUP, self.sampler.device):   # eager warm-up on a side stream
                for _ in range(self.warmup):
                    self.sampler.sample(self.seed_buf, self.num_seeds)
        except Exception as error:   # noqa: BLE001 - e.g. out of memory: the eager sampler needs less
            self.unusable = f"the static sampler failed: {first_line(error)}"
            print(f"cuda_graph: sampling: {self.unusable}; sampling eagerly", flush=True)
        else:
            try:
                self.graph = self.capture(lambda: self.sampler.sample(self.seed_buf, self.num_seeds), generator)
            except CaptureBrokenError:   # the generator is left mid-capture: no state of it can be put back
                generator = None
                raise
            except Exception as error:   # noqa: BLE001 - a capture that ended cleanly: the static sampler runs eagerly
                self.failed = f"the capture failed: {first_line(error)}"
                print(f"cuda_graph: sampling: {self.failed}; sampling eagerly on static shapes", flush=True)
        finally:
            if generator is not None and state is not None:
                generator.set_state(state)
        return self.unusable is None

    def __call__(self, seed_gid: Tensor) -> Data:
        self._load(seed_gid)
        out = self.graph.replay() if self.graph is not None else self.sampler.sample(self.seed_buf, self.num_seeds)
        shape = self.shape
        return Data(edge_index=out.edge_index.clone(), n_id=out.n_id.clone(), batch_size=shape.nodes[0],
                    num_nodes=shape.num_nodes, num_sampled_nodes=list(shape.nodes),
                    num_sampled_edges=list(shape.edges), edges_by_target=True, static=True,
                    real_batch_size=seed_gid.numel(), real_edges=out.real_edges.clone(),
                    padding_rows=shape.num_nodes - out.real_nodes)

    def _load(self, seed_gid: Tensor) -> None:
        n = seed_gid.numel()
        if n > self.seed_buf.numel():
            raise ValueError(f"a batch of {n} seeds for a static shape of {self.seed_buf.numel()}")
        self.seed_buf[:n].copy_(seed_gid)
        self.num_seeds.fill_(n)


def _cuda_capture(fn: Callable[[], StaticBatch], generator: torch.Generator | None) -> CudaGraphOf:
    # its own capture stream, apart from the step's (stages.train.rank.streams)
    return CudaGraphOf(fn, generator=generator, stream=role_stream(SAMPLING_CAPTURE, torch.device("cuda")))


def why_not_graphed_sampling(not_graphed: str | None, *, csr: LocalCSR, fanouts: list[Any], num_nodes: int,
                             every_row_on_device: bool, setting: str) -> str | None:
    """None when a rank's sampling can be graphed too, else why not (the report's words)."""
    if not_graphed is not None:
        return f"the step is not graphed ({not_graphed})"
    if setting != "auto":
        return f"cuda_graph={setting}"
    if _torch_version() < (2, 7):
        # before 2.7 every replay updated the default generator, which fails while the training thread captures
        # its step (pytorch/pytorch#143777 skips a graph that draws nothing from it)
        return f"torch {torch.__version__} (graphed sampling needs 2.7 or later)"
    if not every_row_on_device:
        return "the device holds only part of the feature rows (the gather reads sizes back)"
    return why_not_static(csr, fanouts, num_nodes)


def make_sample_graph(csr: LocalCSR, fanouts: list[int], shape: StaticShape, *, replace: bool,
                      generator: torch.Generator | None) -> SampleGraph:
    """The rank's ``SampleGraph`` over its whole-graph ``csr``."""
    return SampleGraph(StaticSampler(csr, fanouts, shape, replace=replace, generator=generator))


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
