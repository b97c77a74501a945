"""Where a train rank runs and how its collectives travel (stages.train.rank.worker.pick_device, rank_backend; issue
[4/5] item 8): one GPU per rank over NCCL by default, or ``ranks_per_gpu`` ranks on each GPU over gloo (NCCL refuses
two ranks on one device). The GPUs are faked here; tests/test_gpu_train.py trains 2 ranks on one real GPU."""

from __future__ import annotations

import pytest
import torch

from stages.train.params import Params
from stages.train.rank import worker
from stages.train.rank.cache_budget import ranks_sharing_gpu
from stages.train.rank.worker import pick_device, rank_backend
from storage import InputError


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this host has ``n`` GPUs; the devices set current are recorded."""
    chosen: list[int] = []

    def have(n: int) -> list[int]:
        monkeypatch.setattr(worker.torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(worker.torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(worker.torch.cuda, "set_device", chosen.append)
        return chosen
    return have


def test_one_gpu_per_rank_over_nccl_by_default(gpus):
    chosen = gpus(2)
    params = Params(device="cuda")
    assert [pick_device(params, r, 2) for r in (0, 1)] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert chosen == [0, 1] and rank_backend(params, torch.device("cuda", 1), 2) == "nccl"
    assert rank_backend(params, torch.device("cpu"), 2) == "gloo"


def test_ranks_share_one_gpu_over_gloo_when_asked(gpus):
    chosen = gpus(1)
    shared = Params(device="cuda", ranks_per_gpu=2)
    assert [pick_device(shared, r, 2) for r in (0, 1)] == [torch.device("cuda", 0)] * 2 and chosen == [0, 0]
    assert rank_backend(shared, torch.device("cuda", 0), 2) == "gloo"
    auto = Params(ranks_per_gpu=2)   # device=auto takes the GPU once sharing makes it enough
    assert pick_device(auto, 1, 2) == torch.device("cuda", 0)
    four = Params(device="cuda", ranks_per_gpu=2)
    gpus(2)
    assert [pick_device(four, r, 4).index for r in range(4)] == [0, 0, 1, 1]
    assert rank_backend(four, torch.device("cuda", 1), 4) == "gloo"


def test_a_lone_rank_asked_to_share_has_its_gpu_to_itself(gpus):
    """``ranks_per_gpu`` above the host's ranks (stages.train.rank.cache_budget.ranks_sharing_gpu): one rank keeps
    NCCL and the whole device budget, and two ranks on two GPUs asked to share both sit on the first GPU."""
    chosen = gpus(1)
    lone = Params(device="cuda", ranks_per_gpu=2)
    assert pick_device(lone, 0, 1) == torch.device("cuda", 0) and chosen == [0]
    assert rank_backend(lone, torch.device("cuda", 0), 1) == "nccl"
    assert ranks_sharing_gpu(lone, 1) == 1 and ranks_sharing_gpu(lone, 2) == ranks_sharing_gpu(lone, 5) == 2
    gpus(2)
    assert [pick_device(lone, r, 2).index for r in (0, 1)] == [0, 0]


def test_too_few_gpus_is_one_line_naming_the_sharing_setting(gpus, capsys):
    gpus(1)
    with pytest.raises(InputError, match=r"needs 2 GPU\(s\) for 2 ranks on this host, which has 1; tests and "
                                         r"benchmarks can share one over gloo: ranks_per_gpu=2"):
        pick_device(Params(device="cuda"), 0, 2)
    with pytest.raises(InputError, match="needs 2 GPU\\(s\\) for 3 ranks on this host, which has 1 at "
                                         "ranks_per_gpu=2"):
        pick_device(Params(device="cuda", ranks_per_gpu=2), 0, 3)
    assert pick_device(Params(), 0, 2) == torch.device("cpu"), "auto: the CPU, saying why"
    gpus(0)
    with pytest.raises(InputError, match=r"^device=cuda, but this host has no GPU: set device=cpu \(or auto\)$"):
        pick_device(Params(device="cuda", ranks_per_gpu=2), 0, 2)
    assert "training on the CPU" in capsys.readouterr().out
