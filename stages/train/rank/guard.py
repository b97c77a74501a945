"""A NaN or Inf loss stops every rank at the same batch, and the job fails with one line naming epoch and rank.

A non-finite loss on one rank would, through DDP's gradient all-reduce, spread NaN weights to every rank and then
be published as a valid model. Each batch's loss goes into a ``world``-long vector (this rank's slot; the others
0) that one all-reduce (none on a lone rank) gives every rank, so every rank learns which ranks went bad and all
stop at the same batch: none is left waiting in a collective. The lowest bad rank raises ``NonFiniteLossError`` (a
user-facing error: the launcher repeats its line as ``error: rank r: ...``); the others raise ``PeerStoppedError``,
which the worker records as a consequence.

The vector is read one batch late: batch b's is copied to the host without waiting, and read when batch b + 1 is
checked (before its backward pass) or when the pass ends (``finish``). Reading it at once stopped the host on every
batch until the device had finished the forward pass, 2 of a products batch's 10 stream synchronisations on a GPU
(benchmarks/RESULTS.md, [4/5]); one batch later its copy is done. The bad batch's own step then runs, so the weights
are NaN when the error is raised: the pass stops before any checkpoint, best-model copy or publication reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from stages.runtime.collectives import all_reduce, comm_device
from storage.errors import GnnpipeError


class NonFiniteLossError(GnnpipeError):
    """This rank's loss was NaN or Inf: training stopped on every rank and nothing is published."""


class PeerStoppedError(Exception):
    """Another rank's failure stopped this one; that rank reports why (``stages.train.rank.worker`` stays quiet)."""


def _kind(value: float) -> str | None:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return None


@dataclass
class _Pending:
    """A checked batch's losses of every rank, on their way to the host."""

    batch: int
    host: Tensor                       # [world] float32, filled by a copy that may still run
    copied: torch.cuda.Event | None    # recorded after the copy (CUDA); None: the copy is done


class LossGuard:
    """The per-batch check of one pass: ``guard(batch, loss)`` before each backward pass and ``guard.finish()``
    after the last step, on every rank in the same order (both are collectives on several ranks). Each call raises
    for a bad batch before it (module docstring)."""

    def __init__(self, rank: int, world: int, epoch: int) -> None:
        self.rank, self.world, self.epoch = rank, world, epoch
        self._pending: _Pending | None = None

    def __call__(self, batch: int, loss: Tensor) -> None:
        self._raise_if_bad()
        value = loss.detach().reshape(1).to(torch.float32)
        if self.world > 1:   # each rank's loss in its slot, 0 in the others': the sum is every rank's loss
            losses = torch.zeros(self.world, dtype=torch.float32, device=comm_device())
            losses[self.rank:self.rank + 1] = value.to(losses.device)
            value = all_reduce(losses)
        cuda = value.is_cuda
        host = torch.empty(value.shape, dtype=torch.float32, pin_memory=cuda)
        host.copy_(value, non_blocking=cuda)
        copied = None
        if cuda:
            copied = torch.cuda.Event()
            copied.record()
        self._pending = _Pending(batch, host, copied)

    def finish(self) -> None:
        """The pass's last batch's check (raises as ``__call__`` does)."""
        self._raise_if_bad()

    def _raise_if_bad(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.copied is not None:
            pending.copied.synchronize()   # this copy only: the device may still run the batches after it
        kinds = [_kind(v) for v in pending.host.tolist()]
        bad = [(r, k) for r, k in enumerate(kinds) if k is not None]
        if not bad:
            return
        first, kind = bad[0]
        where = f"at epoch {self.epoch + 1}, batch {pending.batch + 1}"
        others = f" (and on rank {', '.join(str(r) for r, _ in bad[1:])})" if len(bad) > 1 else ""
        if self.rank == first:
            raise NonFiniteLossError(f"the loss is {kind} {where}{others}: training stopped on every rank and "
                                     f"nothing was published; lower lr, or check the loss function and the features")
        raise PeerStoppedError(f"rank {first}'s loss is {kind} {where}")
