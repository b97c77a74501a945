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
from tests._train_pipeline import build_upstream, train_params, train_upstream

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("cache_policy", ["hotness", "none"])
def test_one_gpu_trains_to_the_cpu_accuracy_with_the_cache_in_device_memory(tmp_path, cache_policy: str):
    store = ArtifactStore(tmp_path / "art")
    manifests = build_upstream(store, 1)
    manifest = train.run(store, train_params(device="cuda", cache_policy=cache_policy), train_upstream(manifests),
                         log=print)
    metrics = json.loads(store.read_bytes("train", manifest.key, METRICS))
    assert metrics["backend"] == "nccl" and metrics["world_size"] == 1
    assert TrainSummary.from_json(manifest.summary).test_metric >= 0.8, manifest.summary
    epochs = metrics["epochs"]
    assert all(e["remote_rows"] == 0 for e in epochs)
    if cache_policy == "hotness":   # a cached row is a row that did not cross the PCIe link
        assert all(e["cached_rows"] > 0 and e["local_rows"] > 0 for e in epochs)
        assert metrics["ranks"][0]["cache_rows"] > 0
    else:
        assert all(e["cached_rows"] == 0 for e in epochs)
    # where the time goes, on the device's timeline (tests/test_phases.py): the model's work shows on every epoch
    assert metrics["phase_clock"] == "cuda_events"
    for e in epochs:
        split = e["phases_s"]
        assert sum(v[0] for v in split.values()) <= e["epoch_s"] * (1 + 1e-9)
        assert split["forward_backward"][0] > 0 and split["sample"][0] > 0 and split["gather_local"][0] > 0
