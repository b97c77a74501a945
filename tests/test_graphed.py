"""The graphed training step (``stages.train.rank.graphed``) and its padded batches (``static_batch``).

A CPU cannot capture a CUDA graph, so these tests check everything around the capture: the padding leaves every
real output, the loss and the gradients as they were; the static bound holds every batch; a pass through
``GraphedStep`` (its capture replaced by re-running the step on the buffers, which is what a replay computes)
trains as the eager pass does; and which steps may be graphed. The capture itself: ``tests/test_gpu_graphed.py``.
"""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler
from stages.runtime.sampling.static_shape import FAKE_EDGES_PER_SLOT, StaticShape
from stages.train.models.model import BlockGraphSAGE, build_model, seed_logits
from stages.train.rank import graphed
from stages.train.rank.static_batch import IGNORE_LABEL, pad_batch, pad_labels
from stages.train.tasks.node import NodeClassification
from tests._block_graphs import messy_graph
from tests._graphed_cases import Rerun, lone_trainer
from tests._sampler_graphs import power_law_graph

CPU = torch.device("cpu")


def _padded(batch: Data, shape: StaticShape, x: torch.Tensor) -> tuple[Data, torch.Tensor]:
    padded = pad_batch(batch, shape, shape.fake_edge_index(CPU))
    x_pad = torch.zeros(shape.num_nodes, x.shape[1]).index_copy_(0, padded.pad_pos, x)
    return padded, x_pad


@pytest.mark.parametrize(("fanouts", "replace"), [((5, 4, 3), False), ((3, 2), True), ((40,), False)])
def test_a_padded_batch_gives_the_real_seeds_the_same_outputs_loss_and_gradients(fanouts, replace):
    indptr, indices = power_law_graph()
    csr = LocalCSR.from_numpy(indptr, indices)
    num_nodes = csr.num_nodes
    sampler = NeighborSampler(csr, fanouts, replace=replace, generator=torch.Generator().manual_seed(1))
    shape = StaticShape.bound(64, fanouts, num_nodes)
    feats = torch.randn(num_nodes, 12, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, 5, (num_nodes,), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    model = build_model("sage", in_channels=12, hidden=16, out_channels=5, num_layers=len(fanouts), dropout=0.0)
    for seeds in (torch.randperm(num_nodes)[:64], torch.tensor([7, 3]), torch.arange(64)):   # full, short, hubs
        batch = sampler.sample(seeds)
        x, y = feats.index_select(0, batch.n_id), labels.index_select(0, seeds)
        padded, x_pad = _padded(batch, shape, x)
        assert padded.num_sampled_nodes == list(shape.nodes) and padded.num_sampled_edges == list(shape.edges)
        assert padded.real_edges == batch.edge_index.shape[1] and padded.real_batch_size == seeds.numel()
        dst_pos = padded.edge_index[1]
        assert bool((dst_pos[1:] >= dst_pos[:-1]).all()), "still grouped by target"
        model.zero_grad()
        out = seed_logits(model, x, batch)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        out_pad = seed_logits(model, x_pad, padded)
        y_pad = pad_labels(y, shape.nodes[0])
        assert int((y_pad == IGNORE_LABEL).sum()) == shape.nodes[0] - seeds.numel()
        loss_pad = torch.nn.functional.cross_entropy(out_pad, y_pad)
        loss_pad.backward()
        assert out_pad.shape[0] == shape.nodes[0]
        torch.testing.assert_close(out_pad[:seeds.numel()], out, rtol=0, atol=1e-6)
        torch.testing.assert_close(loss_pad, loss, rtol=0, atol=1e-6)
        for p, g in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, g, rtol=0, atol=1e-6)


def test_the_static_bound_holds_every_batch_and_padding_refuses_what_it_does_not_cover():
    csr = LocalCSR.from_numpy(*messy_graph())
    for fanouts, replace in (((4, 3), False), ((4, 3), True), ((30, 30), False)):
        sampler = NeighborSampler(csr, fanouts, replace=replace, generator=torch.Generator().manual_seed(4))
        shape = StaticShape.bound(16, fanouts, csr.num_nodes)
        for lo in range(0, csr.num_nodes - 16, 5):
            batch = sampler.sample(torch.arange(lo, lo + 16))
            assert all(n < p for n, p in zip(batch.num_sampled_nodes, shape.nodes))
            assert all(e <= p for e, p in zip(batch.num_sampled_edges, shape.edges))
    products = StaticShape.bound(1024, (15, 10, 5), 2_400_000)   # the module docstring's figures
    assert products == StaticShape(nodes=(1084, 15960, 156600, 771000), edges=(15360, 153600, 768000),
                                   fake=(60, 600, 3000, 3000))
    fake = products.fake_edge_index(CPU)
    level_end = np.cumsum(products.nodes)
    assert fake.shape == (2, products.num_edges) and bool((fake[1, 1:] >= fake[1, :-1]).all())
    hop_end = np.cumsum(products.edges)
    for h in range(3):   # each hop's fake edges join the reserves of its levels, spread over them
        src, dst = fake[:, hop_end[h] - products.edges[h]:hop_end[h]]
        assert int(dst.min()) == level_end[h] - products.fake[h] and int(dst.max()) == level_end[h] - 1
        assert int(src.min()) == level_end[h + 1] - products.fake[h + 1] and int(src.max()) == level_end[h + 1] - 1
    assert max(int(torch.bincount(row).max()) for row in fake) <= FAKE_EDGES_PER_SLOT
    assert StaticShape.bound(4, (3, 3), 10).nodes == (5, 11, 11), "no level beyond the graph's nodes"
    with pytest.raises(ValueError, match="positive fanout"):
        StaticShape.bound(4, (3, -1), 10)
    sampler = NeighborSampler(csr, (4, 3), generator=torch.Generator().manual_seed(4))
    batch = sampler.sample(torch.arange(16))
    small = StaticShape.bound(8, (4, 3), csr.num_nodes)
    with pytest.raises(ValueError, match="does not fit"):
        pad_batch(batch, small, small.fake_edge_index(CPU))
    shape = StaticShape.bound(16, (4, 3), csr.num_nodes)
    batch.edge_type = torch.zeros(batch.edge_index.shape[1], dtype=torch.long)
    with pytest.raises(ValueError, match="cannot carry edge_type"):
        pad_batch(batch, shape, shape.fake_edge_index(CPU))
    del batch.edge_type
    batch.edges_by_target = False
    with pytest.raises(ValueError, match="grouped by target"):
        pad_batch(batch, shape, shape.fake_edge_index(CPU))





@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_graphed_pass_trains_as_the_eager_one(one_rank_group, tmp_path, monkeypatch, prefetch):
    """Dropout 0 (its masks are drawn over the padded rows): a whole epoch, its short last batch included, gives
    the same sums and, within float rounding, the same weights; each batch after the warm-up is a replay, and the
    buffers take each new batch (edges, rows and labels)."""
    monkeypatch.setattr(graphed, "CudaGraphOf", Rerun)
    Rerun.replays = 0
    results = []
    for mode in ("eager", "graphed"):
        trainer = lone_trainer(tmp_path, mode, prefetch=prefetch)
        # the default, cuda_graph=auto, names the CPU as the reason
        assert trainer.not_graphed == "a CPU rank" and trainer.capture_batches == 0
        if mode == "graphed":
            trainer.not_graphed = None   # as on a CUDA rank with cuda_graph=auto
        trainer.rng.seed_epoch(0)
        batches = list(trainer.loader.train_batches())
        assert batches[-1].numel() < 64, "the epoch ends with a short batch"
        sums = trainer.run_batches(batches, len(batches), epoch=0)
        weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        results.append((sums, weights))
    (eager, w_eager), (graph, w_graph) = results
    assert Rerun.replays == len(batches) - graphed.WARMUP_STEPS
    assert (graph.batches, graph.seeds, graph.sampled_edges) == (eager.batches, eager.seeds, eager.sampled_edges)
    assert graph.metric_sums == eager.metric_sums   # correct predictions, seeds
    assert graph.loss_sum == pytest.approx(eager.loss_sum, rel=1e-5)
    for k in w_eager:
        torch.testing.assert_close(w_graph[k], w_eager[k], rtol=1e-5, atol=1e-6)


class _OwnSage(BlockGraphSAGE):
    """A plug-in's subclass of the built-in: it may change the step (its own ``block_step``, degrees, ...)."""


def test_a_tf32_trainer_sets_the_process_gemms_and_a_float32_one_sets_them_back(one_rank_group, tmp_path):
    """precision=tf32 is float32 tensors with TensorFloat32 GEMMs on a GPU, a process-wide setting: each trainer
    states its own, so a benchmark's float32 run after a tf32 one computes in float32 again."""
    try:
        lone_trainer(tmp_path, "tf32", precision="tf32")
        assert torch.get_float32_matmul_precision() == "high"
        lone_trainer(tmp_path, "float32", precision="float32")
        assert torch.get_float32_matmul_precision() == "highest"
        lone_trainer(tmp_path, "tf32-again", precision="tf32")
        # the default, auto, is float32 on a CPU rank (tf32 on a CUDA one): the trainer holds the resolved value,
        # which the task, the model's wrapper, the graph's reasons and the report read
        default = lone_trainer(tmp_path, "auto")
        assert default.params.precision == "float32" and torch.get_float32_matmul_precision() == "highest"
    finally:   # the process's setting, for the tests after this one
        torch.set_float32_matmul_precision("highest")


def test_precision_auto_is_tf32_on_a_cuda_rank_and_float32_elsewhere():
    from stages.train.params import Params

    assert Params().precision == "auto"
    assert (Params().rank_precision("cuda"), Params().rank_precision("cpu")) == ("tf32", "float32")
    for given in ("float32", "tf32", "bfloat16"):   # a stated precision is kept on every device
        assert {Params(precision=given).rank_precision(d) for d in ("cuda", "cpu")} == {given}


def test_which_steps_may_be_graphed():
    sage = build_model("sage", in_channels=4, hidden=8, out_channels=3, num_layers=2, dropout=0.5)
    cuda = torch.device("cuda", 0)
    node = NodeClassification(lambda gid: gid)
    ok = {"device": cuda, "world": 1, "task": node, "loss": "cross_entropy", "precision": "float32",
          "model": sage, "fanouts": [15, 10], "typed": False, "edge_features": False}
    assert graphed.why_not_graphed("auto", **ok) is None
    assert graphed.why_not_graphed("auto", **{**ok, "precision": "tf32"}) is None, "float32 tensors, TF32 GEMMs"
    link = types.SimpleNamespace(name="link prediction", pads_labels=False)
    plugin = NodeClassification(lambda gid: gid, loss_fn=lambda out, y: out.sum())
    cases = [({"device": CPU}, "a CPU rank"), ({"world": 2}, "several ranks"),
             ({"task": link, "loss": "bce"}, "link prediction with loss bce"),
             ({"task": plugin, "loss": "pkg.mod:fn"}, "node classification with loss pkg.mod:fn"),
             ({"precision": "bfloat16"}, "precision=bfloat16"),
             ({"typed": True}, "a typed graph"), ({"edge_features": True}, "edge features"),
             ({"fanouts": [15, -1]}, "fanout -1"), ({"fanouts": [(2, 3), 4]}, "per edge type"),
             ({"model": build_model("gcn", in_channels=4, hidden=8, out_channels=3, num_layers=2, dropout=0.5)},
              "built-in SAGE"),
             ({"model": build_model("sage", in_channels=4, hidden=8, out_channels=3, num_layers=2, dropout=0.5,
                                    norm="batch_norm")}, "no norm"),
             ({"model": build_model("sage", in_channels=4, hidden=8, out_channels=3, num_layers=2, dropout=0.5,
                                    aggr="max")}, "built-in SAGE"),
             ({"model": _OwnSage(in_channels=4, hidden_channels=8, out_channels=3, num_layers=2)}, "built-in SAGE")]
    for change, why in cases:
        assert why in (graphed.why_not_graphed("auto", **{**ok, **change}) or ""), change
    assert graphed.why_not_graphed("off", **ok) == "cuda_graph=off"
    # several reasons: the report names the first, the rank's, then the task's, then the batch's, then the model's
    assert graphed.why_not_graphed("auto", **{**ok, "task": link, "loss": "bce", "typed": True,
                                             "precision": "bfloat16"}).startswith("link prediction with loss bce")
    assert graphed.why_not_graphed_setup("auto", **{k: ok[k] for k in ("device", "world", "precision", "fanouts",
                                                                       "typed", "edge_features")}) is None


def test_the_report_says_whether_the_step_is_graphed(one_rank_group, tmp_path):
    trainer = lone_trainer(tmp_path, "report", cuda_graph="auto")
    assert trainer.not_graphed == "a CPU rank"
    ranks, trainer.history = [trainer.data.setup], [{"val_metric": 0.5}]
    assert trainer.metrics([0.0, 1.0], [0.0, 1.0], False, None, ranks)["cuda_graph"] == "off: a CPU rank"


def test_an_unpadded_level_layout_is_what_the_bound_assumes():
    """The bound counts hop k's edges from level k - 1 alone: the sampler's frontier is the previous hop's new
    nodes, not every node seen so far (``MultiHopSampler.sample``)."""
    indptr, indices = power_law_graph()
    csr = LocalCSR.from_numpy(indptr, indices)
    batch = NeighborSampler(csr, (6, 6), generator=torch.Generator().manual_seed(0)).sample(torch.arange(32))
    counts = np.diff(indptr)
    nodes = np.cumsum([0, *batch.num_sampled_nodes])
    for k, edges in enumerate(batch.num_sampled_edges):
        frontier = batch.n_id[nodes[k]:nodes[k + 1]].numpy()
        assert edges == int(np.minimum(counts[frontier], 6).sum())


def test_a_captured_step_serves_later_passes_until_the_learning_rate_or_the_state_changes(one_rank_group, tmp_path,
                                                                                        monkeypatch):
    captures = []

    class Counted(Rerun):
        def __init__(self, step, stream=None):
            super().__init__(step, stream)
            captures.append(self)
    monkeypatch.setattr(graphed, "CudaGraphOf", Counted)
    trainer = lone_trainer(tmp_path, "passes")
    trainer.not_graphed = None

    def one_pass() -> None:
        trainer.rng.seed_epoch(0)
        trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 3), 3, epoch=0)
    one_pass()
    assert len(captures) == 1 and trainer._graph is not None and trainer._graph.eager_steps == graphed.WARMUP_STEPS
    assert trainer.capture_batches == graphed.WARMUP_STEPS + 1, "the warm-up steps and the capturing batch"
    one_pass()
    assert len(captures) == 1, "the same learning rate: the pass replays the captured step from its first batch"
    trainer.optimizer.param_groups[0]["lr"] /= 2
    one_pass()
    assert len(captures) == 2 and trainer._graph.eager_steps == 0, "a new capture, without a second warm-up"
    assert trainer._graph.lr == trainer.optimizer.param_groups[0]["lr"]
    trainer.load_state_dict(trainer.state_dict())
    assert trainer._graph is None, "a load replaces Adam's state tensors, which a capture reads"


def test_a_failed_capture_trains_eagerly_and_says_why(one_rank_group, tmp_path, monkeypatch):
    """A capture that raises but ends cleanly (out of memory inside it) costs nothing but the attempt: the batch
    and the rest of the run step eagerly, with the eager run's results, and metrics.json says why."""
    def refuse(step, stream=None):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")
    monkeypatch.setattr(graphed, "CudaGraphOf", refuse)
    results = []
    for mode in ("eager", "graphed"):
        trainer = lone_trainer(tmp_path, mode)
        trainer.not_graphed = None if mode == "graphed" else trainer.not_graphed
        for epoch in range(2):
            trainer.rng.seed_epoch(epoch)
            trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 5), 5, epoch=epoch)
        results.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
    assert trainer.not_graphed == ("the capture failed: OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                   "2.00 GiB") and trainer._graph is None
    for k in results[0]:
        torch.testing.assert_close(results[1][k], results[0][k], rtol=1e-5, atol=1e-6)


def test_a_capture_cuda_invalidated_stops_the_rank_instead_of_training_on(one_rank_group, tmp_path, monkeypatch):
    """An invalidated capture leaves the process's allocator and generators mid-capture (graphed's docstring):
    the step must not go on eagerly (it would draw dropout from a stuck generator) but stop with the fix."""
    def broken(step, stream=None):
        raise graphed.CaptureBrokenError("a CUDA graph capture failed (RuntimeError: x): set cuda_graph=off")
    monkeypatch.setattr(graphed, "CudaGraphOf", broken)
    trainer = lone_trainer(tmp_path, "graphed")
    trainer.not_graphed = None
    trainer.rng.seed_epoch(0)
    with pytest.raises(graphed.CaptureBrokenError, match="set cuda_graph=off"):
        trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 5), 5, epoch=0)
    assert trainer._graph is None or trainer._graph.failed is None, "no eager fallback was recorded"


class _FakeCapture:
    """``torch.cuda.graph``'s stand-in on a CPU: ``end_error`` is what its end (``capture_end``) raises."""

    end_error: Exception | None = None

    def __init__(self, graph, stream=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.end_error is not None:
            raise self.end_error
        return False


@pytest.mark.parametrize(("inside", "end", "raised"), [
    (None, None, None),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"), None, torch.OutOfMemoryError),
    (RuntimeError("CUDA error: operation not permitted when stream is capturing"),
     RuntimeError("CUDA error: operation failed due to a previous error during capture"), graphed.CaptureBrokenError),
    (None, RuntimeError("CUDA error: operation failed due to a previous error during capture"),
     graphed.CaptureBrokenError)])
def test_a_capture_is_broken_only_when_its_end_fails(monkeypatch, inside, end, raised):
    """The fallback's premise (pytorch#180395): a capture whose end succeeds restored the allocator and the
    generators, whatever the captured function raised; one whose end raised did not. The broken case names the
    captured function's own error (the end's is only "a previous error"), the setting to change, and hands the
    caller back its stream."""
    streams = []
    monkeypatch.setattr(_FakeCapture, "end_error", end)
    monkeypatch.setattr(torch.cuda, "graph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: "the caller's stream")
    monkeypatch.setattr(torch.cuda, "set_stream", streams.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def fn():
        if inside is not None:
            raise inside
        return "outputs"
    if raised is None:
        assert graphed.CudaGraphOf(fn, stream=None).outputs == "outputs" and streams == []
        return
    with pytest.raises(raised) as caught:
        graphed.CudaGraphOf(fn, stream=None)
    if raised is graphed.CaptureBrokenError:
        cause = inside if inside is not None else end
        assert f"({type(cause).__name__}: {cause})" in str(caught.value) and "set cuda_graph=off" in str(caught.value)
        assert streams == ["the caller's stream"] and caught.value.__cause__ is end
    else:
        assert caught.value is inside and streams == []


def test_an_earlier_asynchronous_error_is_raised_as_itself_not_as_a_capture_failure(monkeypatch):
    """A device-side assert of an eager step before the capture surfaces at the first synchronisation: that is a
    kernel's error, not the capture's, and must not be told to set cuda_graph=off (nor leave the stream changed)."""
    def earlier_error():
        raise RuntimeError("CUDA error: device-side assert triggered")
    monkeypatch.setattr(torch.cuda, "synchronize", earlier_error)
    monkeypatch.setattr(torch.cuda, "graph", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    with pytest.raises(RuntimeError, match="device-side assert") as caught:
        graphed.CudaGraphOf(lambda: "outputs", stream=None)
    assert not isinstance(caught.value, graphed.CaptureBrokenError)


def test_a_resumed_optimiser_takes_this_runs_fused_and_capturable_flags(one_rank_group, tmp_path):
    """The flags follow the device and cuda_graph, which are not in the key: a checkpoint of a graphed GPU run
    (fused, capturable) resumed by a CPU run keeps the CPU's own, and its steps run."""
    trainer = lone_trainer(tmp_path, "resume")
    trainer.rng.seed_epoch(0)
    trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 2), 2, epoch=0)
    state = trainer.state_dict()
    state["optimizer"]["param_groups"] = [{**g, "fused": True, "capturable": True}
                                          for g in state["optimizer"]["param_groups"]]
    resumed = lone_trainer(tmp_path, "resumed")
    resumed.load_state_dict(state)
    assert all(not g["capturable"] and not g["fused"] for g in resumed.optimizer.param_groups)
    resumed.rng.seed_epoch(1)
    assert resumed.run_batches(itertools.islice(resumed.loader.train_batches(), 2), 2, epoch=1).batches == 2



def test_the_step_products_benchmark_times_the_unpadded_and_padded_batch(tmp_path):
    """``bench_step_spmm.py``, the next GPU's look at the graphed step's CSR products (benchmarks/RESULTS.md,
    session 31), runs on the CPU: both batches eager, the replays named as skipped, the padded batch at the static
    shape's size."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(repo / "benchmarks" / "bench_step_spmm.py"), "--nodes", "3000",
                           "--avg-degree", "8", "--graph", str(tmp_path / "g.npz"), "--batch-size", "64",
                           "--hidden", "16", "--features", "8", "--steps", "2", "--device", "cpu",
                           "--aggregate", "cusparse,index_add"],
                          cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["padded_edges"] == StaticShape.bound(64, (15, 10, 5), 3000).num_edges > got["edges"]
    assert got["padded_nodes"] > got["nodes"]
    for name in ("unpadded", "padded", "unpadded/index_add", "padded/index_add"):
        assert got["cases"][f"{name}/eager"]["ms_per_step"] > 0
        assert got["cases"][f"{name}/replayed"].startswith("skipped")
    # the stand-in aggregation computes the step's products
    assert got["cusparse_max_abs_diff"] == 0 and got["index_add_max_abs_diff"] < 1e-5
