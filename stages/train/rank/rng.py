"""Every random stream of one training rank, reseeded at the start of each epoch (stream ids: ``stages.runtime.seeds``).

Determinism contract: every stream (shuffle, sampler, dropout through torch's global generator, python/numpy) is
reseeded at the start of each epoch from ``(seed, rank, epoch)``, so a run resumed after epoch e draws exactly what
an uninterrupted run draws in epoch e+1 whatever happened before; the checkpoint also stores every rank's states
(``state_dict``). The test pass after the last epoch is seeded as epoch ``epochs``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from stages.runtime.seeds import STREAM_LINK_VALID, STREAM_PY, STREAM_SAMPLER, STREAM_SHUFFLE, STREAM_TORCH, stream_seed


class RngStreams:
    """The shuffle and sampler generators (on the rank's device) and the process-global torch/python/numpy ones."""

    def __init__(self, seed: int, rank: int, device: torch.device) -> None:
        self.seed, self.rank, self.device = seed, rank, device
        self.shuffle = torch.Generator(device=device)   # the order of the rank's train seeds
        self.sampler = torch.Generator(device=device)   # neighbour sampling

    def seed_epoch(self, epoch: int) -> None:
        self.shuffle.manual_seed(stream_seed(self.seed, self.rank, epoch, STREAM_SHUFFLE))
        self.sampler.manual_seed(stream_seed(self.seed, self.rank, epoch, STREAM_SAMPLER))
        torch.manual_seed(stream_seed(self.seed, self.rank, epoch, STREAM_TORCH))
        py_seed = stream_seed(self.seed, self.rank, epoch, STREAM_PY)
        random.seed(py_seed)
        np.random.seed(py_seed % 2**32)

    def seed_validation(self) -> None:
        """Link prediction: the sampler stream of every validation pass starts alike, so that epochs are compared
        on the same negatives and neighbourhoods (node classification keeps the stream as the epoch left it)."""
        self.sampler.manual_seed(stream_seed(self.seed, self.rank, 0, STREAM_LINK_VALID))

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                 "shuffle": self.shuffle.get_state(), "sampler": self.sampler.get_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        self.shuffle.set_state(state["shuffle"])
        self.sampler.set_state(state["sampler"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
