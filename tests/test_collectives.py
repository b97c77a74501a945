"""Every reduction runs on its group's device (issue 30, item 6).

The first GPU run crashed in two benchmarks that all-reduced CPU tensors on an NCCL group ("No backend type
associated with device type cpu"). ``stages.runtime.collectives.all_reduce`` is now the one place a reduction is
made: it moves the tensor to ``comm_device(group)`` and the result back. Without a GPU, a fake NCCL group shows the
move (the backend says "nccl"; ``Tensor.to`` records where it was asked to go); the training tests reduce on real
gloo groups; a source scan keeps every other module off ``dist.all_reduce``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from stages.runtime import collectives

REPO = Path(__file__).resolve().parents[1]


def test_a_cpu_tensor_is_reduced_on_an_nccl_groups_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    moves: list[torch.device] = []
    reduced: list[tuple[torch.device, Any]] = []

    def fake_to(self: torch.Tensor, device: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        moves.append(torch.device(device))   # CPU-only torch cannot make a CUDA tensor: record, stay on the CPU
        return self

    def fake_all_reduce(t: torch.Tensor, op: Any = None, group: Any = None) -> None:
        reduced.append((moves[-1], op))
        t.mul_(2)   # as two ranks' sum of the same values

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    out = collectives.all_reduce_f64([1.0, 2.5], dist.ReduceOp.MAX)
    assert reduced == [(torch.device("cuda", 3), dist.ReduceOp.MAX)]
    assert moves == [torch.device("cuda", 3), torch.device("cpu")]   # there for the collective, then back
    assert out == [2.0, 5.0]


def test_gloo_keeps_cpu_tensors_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    seen: list[torch.device] = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: seen.append(t.device))
    assert collectives.all_reduce(torch.ones(2)).device.type == "cpu" and seen == [torch.device("cpu")]


def test_no_module_reduces_around_the_helper() -> None:
    """``dist.all_reduce`` is called in ``collectives`` only, in the stages and the benchmarks alike."""
    call = re.compile(r"\bdist\.all_reduce\(")
    found = [f"{p.relative_to(REPO)}:{n}" for folder in ("stages", "benchmarks", "flows")
             for p in sorted((REPO / folder).rglob("*.py")) if "work" not in p.relative_to(REPO).parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if call.search(line)]
    assert found == ["stages/runtime/collectives.py:" + str(_helper_line())], found


# every other tensor collective of the stages and benchmarks, each reviewed to put its tensors on the group's device
# (comm_device): a new call site fails the scan below until it is reviewed and added here
REVIEWED_COLLECTIVES = {
    "stages/runtime/collectives.py": {"all_to_all_single", "all_reduce"},   # the helpers themselves
    "stages/train/tasks/link_metrics.py": {"all_gather"},   # parts and input made on comm_device(group)
    "stages/train/rank/checkpoint.py": {"batch_isend_irecv"},   # payload and sizes made on comm_device()
}


def test_every_tensor_collective_is_a_reviewed_one() -> None:
    """A tensor collective outside the helpers (``dist.all_gather``, ``broadcast``, point-to-point, ...) must have
    been checked for its device; the object collectives (``*_object*``) and barriers pickle or carry no tensor."""
    call = re.compile(r"\b(?:dist|torch\.distributed)\.(all_reduce|all_gather|all_gather_into_tensor|broadcast|"
                      r"reduce_scatter|reduce_scatter_tensor|all_to_all|all_to_all_single|reduce|gather|scatter|"
                      r"send|recv|isend|irecv|batch_isend_irecv)\(")
    found: dict[str, set[str]] = {}
    for folder in ("stages", "benchmarks", "flows"):
        for p in sorted((REPO / folder).rglob("*.py")):
            if "work" in p.relative_to(REPO).parts:
                continue
            text = p.read_text()
            assert "from torch.distributed import" not in text, f"{p}: call collectives as dist.<name>"
            assert not re.search(r"import torch\.distributed as (?!dist\b)", text), f"{p}: import it as dist"
            if names := set(call.findall(text)):
                found[str(p.relative_to(REPO))] = names
    assert found == REVIEWED_COLLECTIVES


def _helper_line() -> int:
    lines = (REPO / "stages/runtime/collectives.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "dist.all_reduce(on" in line)
