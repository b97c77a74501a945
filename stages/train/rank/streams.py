"""A CUDA rank's own streams: one per role and device, drawn once per process.

``torch.cuda.Stream()`` does not make a stream: it hands out the next one of a pool of 32 per device (and
priority), in turn, so the 33rd call returns the first again. A stream drawn anew for each pass (a prefetch
producer's) or each capture (its warm-up's) would, 32 draws later, be the very stream a graph is being captured on,
and that capture would record the other thread's kernels into the graph, or fail on its synchronisations. A
benchmark that builds a trainer per setting (12 timed runs and 6 profiles in ``gpu_check --compare``) draws dozens.
The five roles' streams are drawn once, together, at the first that a device's rank asks for (five consecutive
draws: five distinct streams, whatever draws from the pool later); the step's capture takes its own role's rather
than PyTorch's shared capture stream (a pool stream as well).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

__all__ = ["PREFETCH", "ROLES", "SAMPLING_CAPTURE", "SAMPLING_WARMUP", "STEP_CAPTURE", "STEP_WARMUP", "on_role_stream",
           "role_stream"]

PREFETCH = "prefetch"                   # the prefetch producer's work (sampling, gather, copies), every pass
STEP_WARMUP = "step-warmup"             # the graphed step's eager steps, before and instead of its capture
STEP_CAPTURE = "step-capture"           # the step's capture
SAMPLING_WARMUP = "sampling-warmup"     # the static sampler's warm-up before its capture
SAMPLING_CAPTURE = "sampling-capture"   # the static sampler's capture
ROLES = (PREFETCH, STEP_WARMUP, STEP_CAPTURE, SAMPLING_WARMUP, SAMPLING_CAPTURE)


def role_stream(role: str, device: torch.device) -> torch.cuda.Stream:
    """The stream of ``role`` on the CUDA ``device`` ("cuda" alone: the current device), the same at every call."""
    if role not in ROLES:
        raise ValueError(f"unknown stream role {role!r}: one of {', '.join(ROLES)}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _drawn(index)[role]


@contextlib.contextmanager
def on_role_stream(role: str, device: torch.device) -> Iterator[None]:
    """The block's work on ``role``'s stream, ordered after what the current stream queued before it and before
    what it queues after (a capture's eager warm-up runs so, as PyTorch's CUDA graph notes ask); on a CPU, as is."""
    if device.type != "cuda":
        yield
        return
    main, side = torch.cuda.current_stream(device), role_stream(role, device)
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        main.wait_stream(side)


@functools.cache
def _drawn(index: int) -> dict[str, torch.cuda.Stream]:
    # every role's at once, back to back: five consecutive draws of the pool are five distinct streams, whatever
    # else draws from it later (a process group's communicators, a library's side stream)
    return {role: torch.cuda.Stream(torch.device("cuda", index)) for role in ROLES}
