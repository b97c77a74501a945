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


def _post_all(store_of, kinds: list[tuple[str, str]]) -> list[BaseException | None]:
    """Each (kind, host) posted by its own rank, on threads sharing one store: what each rank raised."""
    import threading

    from stages.train.rank.worker import same_device_kind

    raised: list[BaseException | None] = [None] * len(kinds)

    def rank_body(rank: int) -> None:
        try:
            same_device_kind(store_of(), rank, len(kinds), kinds[rank][0], host=kinds[rank][1], setting="auto")
        except BaseException as err:  # noqa: BLE001 - the test reads what each rank raised
            raised[rank] = err

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(len(kinds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return raised


def test_ranks_on_different_kinds_of_device_are_refused_before_the_group_starts():
    """device=auto on a node short of GPUs puts its ranks on the CPU (gloo) while the others take NCCL: each side
    then waited for the other in its first collective until peer_timeout_s. Every rank now says the same line."""
    import datetime

    store = torch.distributed.HashStore()
    store.set_timeout(datetime.timedelta(seconds=20))
    raised = _post_all(lambda: store, [("cuda", "gpu-a"), ("cuda", "gpu-a"), ("cpu", "cpu-b"), ("cuda", "gpu-c")])
    assert all(isinstance(err, InputError) for err in raised), raised
    assert {str(err) for err in raised} == {
        "device=auto put this job's ranks on different kinds of device (GPUs on gpu-a, gpu-c; CPU on cpu-b): one "
        "job trains on one kind; set device=cpu, or run on nodes that each have a GPU per rank"}
    same = torch.distributed.HashStore()
    assert _post_all(lambda: same, [("cuda", "a"), ("cuda", "b")]) == [None, None]


def test_two_ranks_join_their_group_through_the_agreement(tmp_path):
    """The worker's join: a rendezvous of its own (the local agent's file store), the agreement, then the group on
    the same store, whose collectives work; the rank that disagrees fails in one line before any collective."""
    import os
    import subprocess
    import sys

    from stages.jobs.local_agent import INIT_METHOD_ENV

    # os._exit, as the workers end: gloo's teardown at interpreter exit can hang or crash (stages.train.rank.worker)
    script = ("import os, sys, torch, torch.distributed as dist\n"
              "from stages.train.params import Params\n"
              "from stages.train.rank.worker import join_process_group\n"
              "device = torch.device(sys.argv[1])\n"
              "try:\n"
              "    join_process_group(Params(peer_timeout_s=30), device, 1)\n"
              "except Exception as err:\n"
              "    print('refused:', err, flush=True); os._exit(2)\n"
              "t = torch.ones(1); dist.all_reduce(t); dist.barrier(); print('sum', int(t), flush=True); os._exit(0)\n")

    def run(devices: list[str], name: str) -> list[subprocess.CompletedProcess[str]]:
        procs = [subprocess.Popen([sys.executable, "-c", script, d], text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE,
                                  env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
                                       INIT_METHOD_ENV: f"file://{tmp_path / name}?rank={r}&world_size=2"})
                 for r, d in enumerate(devices)]
        try:
            said = [p.communicate(timeout=60) for p in procs]
        finally:   # a rank left waiting (its peer died first) must not outlive the test
            for p in procs:
                p.kill()
        return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, said, strict=True)]

    agreed = run(["cpu", "cpu"], "agreed")
    assert [p.returncode for p in agreed] == [0, 0] and all("sum 2" in p.stdout for p in agreed), agreed
    mixed = run(["cpu", "cuda"], "mixed")   # a cuda device object needs no GPU: refused before it is used
    assert [p.returncode for p in mixed] == [2, 2], mixed
    assert all("refused: device=auto put this job's ranks on different kinds" in p.stdout for p in mixed)
