"""The graphed training step on a GPU (``stages.train.rank.graphed``; run by ``make gpu-check``, skipped without
CUDA): a real capture replays what the eager step computes, without stopping the host, and the 1-GPU train stage
with ``cuda_graph=auto`` trains to the CPU accuracy (tests/test_gpu_train.py's threshold)."""

from __future__ import annotations

import json

import pytest
import torch

from stages.runtime.sampler import LocalCSR, NeighborSampler
from stages.train import stage as train
from stages.train.models.model import build_model
from stages.train.rank.graphed import GraphedStep
from stages.train.rank.static_batch import StaticShape
from stages.train.tasks.node import NodeClassification
from storage import ArtifactStore
from storage.train import METRICS
from storage.train_summary import TrainSummary
from tests._sampler_graphs import power_law_graph
from tests._train_pipeline import build_upstream, train_params, train_upstream
from tests.test_graphed import _Rerun

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _steps(capture) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Six training steps of a small SAGE on one GPU through ``GraphedStep`` with ``capture`` (None: CUDA's);
    dropout 0, so the eager re-run and the replays compute the same thing."""
    cuda = torch.device("cuda", 0)
    indptr, indices = power_law_graph()
    csr = LocalCSR.from_numpy(indptr, indices).to_device(cuda)
    feats = torch.randn(csr.num_nodes, 12, generator=torch.Generator().manual_seed(2)).to(cuda)
    labels = torch.randint(0, 5, (csr.num_nodes,), generator=torch.Generator().manual_seed(3)).to(cuda)
    torch.manual_seed(0)
    model = build_model("sage", in_channels=12, hidden=16, out_channels=5, num_layers=2, dropout=0.0).to(cuda)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, fused=True, capturable=True)
    task = NodeClassification(lambda gid: labels.index_select(0, gid))
    step = GraphedStep(model, optimizer, task, StaticShape.bound(64, (4, 3), csr.num_nodes), cuda, capture=capture)
    sampler = NeighborSampler(csr, (4, 3), generator=torch.Generator(cuda).manual_seed(1))
    losses = []
    for b in range(6):
        seeds = torch.randperm(csr.num_nodes, generator=torch.Generator().manual_seed(b))[:64 - b].to(cuda)
        batch = step.pad(sampler.sample(seeds), task.label_of(seeds))
        x = feats.index_select(0, batch.n_id)
        if step.captured:   # a replay and its buffers' loads stop the host nowhere
            torch.cuda.set_sync_debug_mode("error")
        try:
            _, loss = step(batch, x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        losses.append(float(loss))
    assert step.captured
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, losses


def test_a_captured_step_replays_what_the_eager_step_computes():
    (captured, losses), (eager, eager_losses) = _steps(None), _steps(_Rerun)
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    for k in eager:
        torch.testing.assert_close(captured[k], eager[k], rtol=1e-5, atol=1e-6)


def test_one_gpu_trains_to_the_cpu_accuracy_with_a_graphed_step(tmp_path):
    """A cosine schedule changes the learning rate every epoch: each pass captures anew."""
    store = ArtifactStore(tmp_path / "art")
    manifests = build_upstream(store, 1)
    params = train_params(device="cuda", cuda_graph="auto", lr_schedule="cosine")
    manifest = train.run(store, params, train_upstream(manifests), log=print)
    metrics = json.loads(store.read_bytes("train", manifest.key, METRICS))
    assert metrics["cuda_graph"] == "on" and metrics["prefetch"] == 1
    assert TrainSummary.from_json(manifest.summary).test_metric >= 0.8, manifest.summary
