"""Where a training pass's time goes (stages.runtime.phases, issue [4/5] item 5): the clock charges the innermost
phase, costs nothing where no clock is current, and the loop's split of a real epoch adds up to its wall time, with
prefetch moving the sampling and the gather to the producer's own split. The 2-rank split in metrics.json is checked
in tests/test_train.py (test_two_ranks_learn_far_above_chance_and_an_mlp)."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from stages.runtime import phases as phases_module
from stages.runtime.csr import LocalCSR
from stages.runtime.phases import PhaseClock, clock_kind, current_clock, measuring, phase
from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from stages.train.models.model import build_model
from stages.train.rank.loop import EpochSums, train_epoch
from stages.train.tasks import NodeClassification
from storage.phases import PHASES
from tests._sampler_graphs import class_graph

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def test_the_innermost_open_phase_is_charged(monkeypatch):
    ticks = itertools.count()   # a clock that advances one second per reading
    monkeypatch.setattr(phases_module.time, "perf_counter", lambda: float(next(ticks)))
    clock = PhaseClock(torch.device("cpu"))
    # readings at each boundary: 0 enter gather, 1 enter exchange (gather +1), 2 leave it (exchange +1), 3 enter
    # gather_local (gather +1), 4 enter exchange (gather_local +1), 5 leave it (exchange +1), 6 leave gather_local
    # (gather_local +1), 7 leave gather (gather +1)
    with measuring(clock), phase("gather"):
        with phase("exchange"):
            pass
        with phase("gather_local"), phase("exchange"):
            pass
    got = clock.totals()
    assert set(got) == set(PHASES)
    assert {k: v for k, v in got.items() if v} == {"gather": 3.0, "exchange": 2.0, "gather_local": 2.0}


def test_without_a_current_clock_a_phase_does_nothing():
    assert current_clock() is None
    with phase("sample"):
        pass
    with pytest.raises(ValueError, match="unknown phase 'sampling'"):
        phase("sampling")
    outer, inner = PhaseClock(torch.device("cpu")), PhaseClock(torch.device("cpu"))
    seen: list[PhaseClock | None] = []
    with measuring(outer):
        with measuring(inner):
            assert current_clock() is inner
        assert current_clock() is outer
        thread = threading.Thread(target=lambda: seen.append(current_clock()))   # a clock is one thread's
        thread.start()
        thread.join()
    assert current_clock() is None and seen == [None]
    assert clock_kind(torch.device("cpu")) == "wall_clock" and clock_kind(torch.device("cuda", 0)) == "cuda_events"


def _epoch(prefetch: int, device: str = "cpu") -> EpochSums:
    dev = torch.device(device)
    csr, x, y = class_graph()
    csr = LocalCSR(csr.start_gid, csr.indptr.to(dev), csr.indices.to(dev), csr.num_edge_types)
    x, y = x.to(dev), y.to(dev)
    sampler = NeighborSampler(csr, [5, 5], generator=torch.Generator(dev).manual_seed(1))
    torch.manual_seed(0)
    model = build_model("sage", in_channels=3, hidden=16, out_channels=3, num_layers=2, dropout=0.3).to(dev)
    batches = iter_seed_batches(torch.arange(0, 300, device=dev), 40, generator=torch.Generator(dev).manual_seed(2))
    return train_epoch(model, torch.optim.Adam(model.parameters()), batches, sampler.sample, lambda n_id: x[n_id],
                       NodeClassification(lambda s: y[s]), num_real_batches=8, device=dev, prefetch=prefetch)


def _check_split(sums: EpochSums) -> None:
    split = sums.phases_s
    assert list(split) == list(PHASES) and all(v >= 0 for v in split.values())
    assert sum(split.values()) == pytest.approx(sums.wall_s, rel=1e-6), "the split adds up to the pass"
    assert split["forward_backward"] > 0 and split["optimizer"] > 0 and split["wait"] > 0


def test_an_epoch_is_split_into_phases_that_add_up_to_its_wall_time(one_torch_thread):
    sync = _epoch(0)
    _check_split(sync)
    assert sync.phase_clock == "wall_clock" and sync.prefetch_phases_s == {}
    assert sync.phases_s["sample"] > 0 and sync.phases_s["gather"] > 0   # prepared in the model's thread
    assert sync.phases_s["exchange"] == 0, "one process: no collective"

    ahead = _epoch(1)
    _check_split(ahead)
    assert ahead.phases_s["sample"] == 0 and ahead.phases_s["gather"] == 0, "prepared by the producer"
    assert ahead.prefetch_phases_s["sample"] > 0 and ahead.prefetch_phases_s["gather"] > 0
    assert ahead.loss_sum == sync.loss_sum, "measuring changes nothing"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_epoch_is_split_by_cuda_events():
    for prefetch in (0, 1):
        sums = _epoch(prefetch, "cuda")
        assert sums.phase_clock == "cuda_events"
        _check_split(sums)
        measured = sum(v for k, v in sums.phases_s.items() if k != "other")
        assert measured <= sums.wall_s, "the device's timeline between the first and last mark lies in the pass"
        assert (sums.prefetch_phases_s.get("sample", 0) > 0) == (prefetch == 1)
