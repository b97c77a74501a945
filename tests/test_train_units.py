"""Single-process pieces of the train stage: models on sampled batches, the loops, accuracy, checkpoints."""

from __future__ import annotations

import pytest
import torch

from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from stages.runtime.seeds import stream_seed
from stages.train.models.model import MODELS, build_model, seed_logits
from stages.train.rank.checkpoint import load_latest_checkpoint, save_checkpoint
from stages.train.rank.loop import eval_sums, train_epoch
from stages.train.tasks import NodeClassification, ogb_accuracy_counts
from storage.train import list_checkpoints
from tests._sampler_graphs import class_graph

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.mark.parametrize("kind", MODELS)
def test_models_on_sampled_batches_and_empty_ones(kind, one_torch_thread):
    csr, x, _ = class_graph()
    sampler = NeighborSampler(csr, [5, 3], generator=torch.Generator().manual_seed(0))
    model = build_model(kind, in_channels=3, hidden=16, out_channels=3, num_layers=2, dropout=0.2)
    for seed_gid in (torch.tensor([4, 9, 100]), torch.empty(0, dtype=torch.long)):
        batch = sampler.sample(seed_gid)
        logits = seed_logits(model, x[batch.n_id], batch)
        assert logits.shape == (seed_gid.numel(), 3)
        model.zero_grad(set_to_none=True)
        (logits.sum() * 0 + logits.sum()).backward()
        # DDP needs every parameter's gradient on every rank, also for a rank whose batch is empty
        assert all(p.grad is not None for p in model.parameters()), kind


def test_block_forward_equals_the_full_forward(one_torch_thread):
    """The block path (layer by layer on bipartite blocks) against the model's own whole-batch forward; every
    built-in, fanout and training-mode gradient: tests/test_blocks.py."""
    csr, x, _ = class_graph()
    sampler = NeighborSampler(csr, [4, 4], generator=torch.Generator().manual_seed(1))
    model = build_model("sage", in_channels=3, hidden=8, out_channels=3, num_layers=2, dropout=0.0).eval()
    batch = sampler.sample(torch.arange(10))
    full = model(x[batch.n_id], batch.edge_index)[:10]
    assert torch.allclose(seed_logits(model, x[batch.n_id], batch), full, atol=1e-6)


def test_loop_learns_in_one_process(one_torch_thread):
    csr, x, y = class_graph()
    sampler = NeighborSampler(csr, [5, 5], generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model("sage", in_channels=3, hidden=16, out_channels=3, num_layers=2, dropout=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    train_gid, test_gid = torch.arange(0, 300), torch.arange(300, 600)
    gen = torch.Generator().manual_seed(0)
    calls = []
    task = NodeClassification(lambda s: y[s])
    for _ in range(10):
        sums = train_epoch(model, opt, iter_seed_batches(train_gid, 50, generator=gen), sampler.sample,
                           lambda n_id: x[n_id], task, num_real_batches=5, device=torch.device("cpu"),
                           on_batch=calls.append)
    assert sums.batches == 6 and sums.seeds == 250, "metrics count only the real batches"
    assert calls[:6] == list(range(6)) and sums.metric_sums[1] == 250
    correct, total = eval_sums(model, [test_gid[:150], torch.empty(0, dtype=torch.long), test_gid[150:]],
                               sampler.sample, lambda n_id: x[n_id], task)
    features_only = float((x[test_gid].argmax(1) == y[test_gid]).float().mean())   # the Bayes rule: 0.54
    assert total == 300 and correct / total > features_only + 0.2, (correct / total, features_only)  # 0.82


def test_ogb_accuracy_counts_format():
    assert ogb_accuracy_counts({"y_true": torch.tensor([[1], [2], [0]]), "y_pred": torch.tensor([[1], [0], [0]])}) \
        == (2, 3)
    with pytest.raises(ValueError, match=r"must both be \[n, 1\]"):
        ogb_accuracy_counts({"y_true": torch.tensor([1, 2]), "y_pred": torch.tensor([1, 2])})


def test_stream_seeds_differ_by_rank_epoch_and_stream_and_repeat():
    seeds = {stream_seed(0, r, e, s) for r in range(3) for e in range(3) for s in range(4)}
    assert len(seeds) == 36 and all(0 <= s < 2**63 for s in seeds)
    assert stream_seed(5, 1, 2, 3) == stream_seed(5, 1, 2, 3)


def test_checkpoints_are_atomic_pruned_and_fall_back(tmp_path):
    for epoch in range(4):
        save_checkpoint(tmp_path, epoch, {"epoch": epoch, "w": torch.full((3,), float(epoch))})
    assert [e for e, _ in list_checkpoints(tmp_path)] == [2, 3], "only the 2 newest are kept"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name], "no temporary file is left behind"
    assert load_latest_checkpoint(tmp_path)["epoch"] == 3
    list_checkpoints(tmp_path)[-1][1].write_bytes(b"truncated by a disk error")
    assert load_latest_checkpoint(tmp_path)["epoch"] == 2
    assert load_latest_checkpoint(tmp_path / "missing") is None


def test_auto_cache_policy_caches_what_saves_work_on_the_device():
    from stages.train.rank.cache_policy import resolve_policy

    assert resolve_policy("auto", "cuda") == "hotness"       # own rows still save a host→device copy
    assert resolve_policy("auto", "cpu") == "hotness-remote"  # own rows are in RAM already
    assert resolve_policy("degree", "cpu") == "degree"
