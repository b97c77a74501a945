"""A NaN or Inf loss stops every rank at the same batch, and the job fails with one line naming epoch and rank.

A non-finite loss on one rank would, through DDP's gradient all-reduce, spread NaN weights to every rank and then
be published as a valid model. The check runs before the backward pass and is itself a collective (one
all-reduce of a ``world``-long flag vector per batch, some microseconds beside the batch's sampling exchanges), so
every rank learns which ranks went bad and all stop at the same batch: none is left waiting in a collective.
The lowest bad rank raises ``NonFiniteLossError`` (a user-facing error: the launcher repeats its line as
``error: rank r: ...``); the others raise ``PeerStoppedError``, which the worker records as a consequence.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stages.runtime.collectives import all_reduce, comm_device
from stages.train.rank.loop import CheckLoss
from storage.errors import GnnpipeError

_KINDS = {1.0: "nan", 2.0: "inf", 3.0: "-inf"}


class NonFiniteLossError(GnnpipeError):
    """This rank's loss was NaN or Inf: training stopped on every rank and nothing is published."""


class PeerStoppedError(Exception):
    """Another rank's failure stopped this one; that rank reports why (``stages.train.rank.worker`` stays quiet)."""


def _kind(value: float) -> float:
    if math.isnan(value):
        return 1.0
    if math.isinf(value):
        return 2.0 if value > 0 else 3.0
    return 0.0


def loss_check(rank: int, world: int, epoch: int) -> CheckLoss:
    """The per-batch check of ``epoch`` (0-based) for this rank, a collective every rank calls at every batch."""
    device = comm_device()

    def check(batch: int, loss: Tensor) -> None:
        flags = torch.zeros(world, dtype=torch.float32, device=device)   # already where the collective runs
        flags[rank] = _kind(float(loss.detach()))
        flags = all_reduce(flags)
        bad = [(r, _KINDS[f]) for r, f in enumerate(flags.tolist()) if f]
        if not bad:
            return
        first, kind = bad[0]
        where = f"at epoch {epoch + 1}, batch {batch + 1}"
        others = f" (and on rank {', '.join(str(r) for r, _ in bad[1:])})" if len(bad) > 1 else ""
        if rank == first:
            raise NonFiniteLossError(f"the loss is {kind} {where}{others}: training stopped on every rank and "
                                     f"nothing was published; lower lr, or check the loss function and the features")
        raise PeerStoppedError(f"rank {first}'s loss is {kind} {where}")

    return check
