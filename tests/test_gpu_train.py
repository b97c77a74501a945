"""The train stage on a GPU (issue [7/7] items 4 and 5; run by ``make gpu-check``, skipped without CUDA): one nccl
rank per partition on the device, the hot rows cached in device memory, the rest from pinned host rows; the same
model quality as the CPU ranks (tests/test_train.py's thresholds: 1 partition, test 0.825-0.832 over seeds 0-3)."""

from __future__ import annotations

import json

import pytest
import torch

from stages.train import stage as train
from storage import ArtifactStore
from storage.train import METRICS
from storage.train_summary import TrainSummary
from tests._gpu_marks import needs_tensorboard
from tests._train_pipeline import GRAPH, build_upstream, train_params, train_upstream

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              needs_tensorboard]


@pytest.mark.parametrize(("cache_policy", "cap", "graph"), [("hotness", None, "auto"), ("hotness", 0.2, "uva"),
                                                            ("none", None, "auto")])
def test_one_gpu_trains_to_the_cpu_accuracy_with_the_cache_in_device_memory(tmp_path, cache_policy: str,
                                                                            cap: float | None, graph: str):
    """``graph``: the CSR in device memory (auto: this small graph fits) or pinned and sampled in place (uva)."""
    store = ArtifactStore(tmp_path / "art")
    manifests = build_upstream(store, 1)
    params = train_params(device="cuda", cache_policy=cache_policy, device_cache_ratio=cap, graph_placement=graph)
    manifest = train.run(store, params, train_upstream(manifests), log=print)
    metrics = json.loads(store.read_bytes("train", manifest.key, METRICS))
    assert metrics["backend"] == "nccl" and metrics["world_size"] == 1
    assert metrics["ranks"][0]["graph"] == ("device" if graph == "auto" else "uva")
    assert TrainSummary.from_json(manifest.summary).test_metric >= 0.8, manifest.summary
    epochs = metrics["epochs"]
    assert all(e["remote_rows"] == 0 for e in epochs)
    rank = metrics["ranks"][0]
    if cache_policy == "none":
        assert all(e["cached_rows"] == 0 for e in epochs)
    elif cap is None:   # the device's budget: a small graph's every row sits in device memory (cache_budget)
        assert rank["cache_budget"].startswith("device: ") and rank["cache_rows"] == GRAPH["num_nodes"]
        assert all(e["local_rows"] == 0 and e["hit_rate"] == 1.0 for e in epochs)
    else:   # capped: a cached row is a row that did not cross the PCIe link, the rest did
        assert rank["cache_budget"] == "device_cache_ratio 0.2" and 0 < rank["cache_rows"] < GRAPH["num_nodes"]
        assert all(e["cached_rows"] > 0 and e["local_rows"] > 0 for e in epochs)
    # where the time goes, on the device's timeline (tests/test_phases.py): the model's work shows on every epoch,
    # the batches' preparation in the prefetch thread (a lone GPU rank prefetches one batch by default)
    assert metrics["phase_clock"] == "cuda_events" and metrics["prefetch"] == 1
    for e in epochs:
        split, ahead = e["phases_s"], e["prefetch_phases_s"]
        assert sum(v[0] for v in split.values()) <= e["epoch_s"] * (1 + 1e-9)
        assert split["forward_backward"][0] > 0 and split["sample"][0] == 0 and ahead["sample"][0] > 0
        assert ahead["gather_local"][0] > 0 or e["local_rows"] == 0


def test_two_partitions_share_one_gpu_over_gloo_and_train_to_the_cpu_ranks_result(tmp_path):
    """The multi-rank GPU path on one card (ranks_per_gpu=2): remote rows exchanged between GPU ranks, distributed
    sampling, a device cache per rank; tests/test_train.py's 2 CPU ranks reach test accuracy >= 0.75. Uncapped,
    each rank's budget holds every row of this small graph, its peer's too, and no row would cross (seen on an
    H200): the cap keeps the exchange in the test."""
    store = ArtifactStore(tmp_path / "art")
    manifests = build_upstream(store, 2)
    params = train_params(device="cuda", ranks_per_gpu=2, device_cache_ratio=0.2)
    manifest = train.run(store, params, train_upstream(manifests), log=print)
    metrics = json.loads(store.read_bytes("train", manifest.key, METRICS))
    assert metrics["backend"] == "gloo" and metrics["world_size"] == 2 and metrics["ranks_per_gpu"] == 2
    assert metrics["device"].startswith("cuda")
    assert TrainSummary.from_json(manifest.summary).test_metric >= 0.75, manifest.summary
    assert all(e["remote_rows"] > 0 for e in metrics["epochs"]), "the ranks exchanged rows"
    assert "2 ranks sharing each GPU" in train.report(manifest).markdown


def test_the_loss_guard_does_not_stop_the_host_on_a_gpu():
    """A lone GPU rank's guard copies each loss to the host without waiting (torch raises on any synchronising op
    under the "error" debug mode) and names a NaN batch at the next check."""
    from stages.train.rank.guard import LossGuard, NonFiniteLossError

    guard = LossGuard(0, 1, epoch=0)
    guard(0, torch.tensor(1.0, device="cuda"))   # first pinned buffer and event outside the debug mode
    losses = torch.tensor([0.5, float("nan"), 0.25], device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        guard(1, losses[0])
        guard(2, losses[1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with pytest.raises(NonFiniteLossError, match="^the loss is nan at epoch 1, batch 3:"):
        guard(3, losses[2])
