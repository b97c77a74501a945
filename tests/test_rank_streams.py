"""A CUDA rank's streams (``stages.train.rank.streams``): one per role, drawn once, so the prefetch producer's stream
is never the one a graph is being captured on. PyTorch hands out the streams of a pool of 32 in turn; a stand-in pool
that does the same stands in for the device here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from stages.train.rank import streams
from stages.train.rank.graphed import CudaGraphOf

REPO = Path(__file__).resolve().parents[1]
POOL = 32   # torch.cuda.Stream(): the next of 32 streams per device and priority (c10/cuda/CUDAStream.cpp)


class PoolStream:
    """``torch.cuda.Stream`` as PyTorch makes it: the n-th draw on a device is the pool's stream n mod 32."""

    drawn: dict[int, int] = {}

    def __init__(self, device: torch.device | None = None) -> None:
        index = 0 if device is None or device.index is None else device.index
        n = type(self).drawn.get(index, 0)
        type(self).drawn[index] = n + 1
        self.stream_id = (index, n % POOL)


@pytest.fixture()
def pool(monkeypatch: pytest.MonkeyPatch):
    PoolStream.drawn = {}
    monkeypatch.setattr(torch.cuda, "Stream", PoolStream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    streams._drawn.cache_clear()
    yield PoolStream
    streams._drawn.cache_clear()


def test_a_stream_drawn_per_pass_comes_back_as_the_capture_stream(pool):
    """Why the roles: 32 draws after the capture stream, a pass's fresh stream is the same stream."""
    capture = torch.cuda.Stream(torch.device("cuda", 0))
    per_pass = [torch.cuda.Stream(torch.device("cuda", 0)) for _ in range(POOL)]
    assert per_pass[-1].stream_id == capture.stream_id


def test_each_role_draws_its_stream_once_and_the_roles_stay_apart(pool):
    prefetch = streams.role_stream(streams.PREFETCH, torch.device("cuda", 0))   # a first pass, before any capture
    for _ in range(POOL - 1):   # others' draws between the rank's first stream and its next role (a process group)
        torch.cuda.Stream(torch.device("cuda", 0))
    for _ in range(3 * POOL):   # many passes and captures, as gpu_check --compare's 18 trainers make
        for role in streams.ROLES:
            streams.role_stream(role, torch.device("cuda", 0))
    on_0 = {role: streams.role_stream(role, torch.device("cuda")) for role in streams.ROLES}   # "cuda": current
    assert pool.drawn == {0: len(streams.ROLES) + POOL - 1}, "one draw a role, all at the first"
    assert len({s.stream_id for s in on_0.values()}) == len(streams.ROLES), "five distinct streams"
    assert on_0[streams.PREFETCH] is prefetch
    on_1 = streams.role_stream(streams.PREFETCH, torch.device("cuda", 1))
    assert on_1.stream_id == (1, 0) and on_1 is not on_0[streams.PREFETCH], "a device's own streams"
    with pytest.raises(ValueError, match="unknown stream role 'copy'"):
        streams.role_stream("copy", torch.device("cuda", 0))


def test_no_rank_code_draws_a_stream_of_its_own():
    """Every stream of the stages comes from ``role_stream``: a ``torch.cuda.Stream()`` drawn per pass or per
    capture would wrap around the pool onto a capture stream; and only ``CudaGraphOf`` captures, on the stream its
    caller names (a required argument)."""
    drawn, captured = [], []
    for path in sorted((REPO / "stages").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{n}"
            if re.search(r"cuda\.Stream\(", line) and path.name != "streams.py":
                drawn.append(where)
            if re.search(r"cuda\.graph\(", line):
                captured.append(where)
    assert not drawn, f"draw the stream through stages.train.rank.streams.role_stream: {drawn}"
    assert len(captured) == 1 and captured[0].startswith("stages/train/rank/graphed.py:"), captured
    assert "stream" in inspect.signature(CudaGraphOf).parameters
    assert inspect.signature(CudaGraphOf).parameters["stream"].default is inspect.Parameter.empty


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_hands_out_a_pool_of_streams_and_each_role_keeps_one():
    """The premise on the device: the 33rd ``torch.cuda.Stream()`` is the first one again; the roles' streams are
    distinct and the same at each call."""
    draws = [torch.cuda.Stream() for _ in range(POOL + 1)]
    assert len({d.cuda_stream for d in draws[:POOL]}) == POOL
    assert draws[POOL].cuda_stream == draws[0].cuda_stream, "the pool wrapped: a fresh draw is an old stream"
    device = torch.device("cuda", torch.cuda.current_device())
    roles = {role: streams.role_stream(role, device) for role in streams.ROLES}
    assert len({s.cuda_stream for s in roles.values()}) == len(streams.ROLES)
    assert all(streams.role_stream(role, device) is s for role, s in roles.items())
