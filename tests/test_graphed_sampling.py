"""The producer's sampling as one captured graph (``stages.train.rank.graphed_sampling``), on a CPU.

A CPU cannot capture, so the capture is replaced by re-running the static sampler on the buffers (what a replay
computes); the capture itself, with its generator: ``tests/test_gpu_graphed.py``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.static_sampler import StaticSampler
from stages.runtime.sampling.static_shape import StaticShape
from stages.train.rank import graphed, graphed_sampling
from stages.train.rank.graphed_sampling import SampleGraph, why_not_graphed_sampling
from tests._graphed_cases import Rerun, lone_trainer, low_degree_graph
from tests._sampler_graphs import power_law_graph


class _RerunSampling:
    """A captured sampling graph's stand-in: each replay re-runs the sampler on the buffers as they are now."""

    captures = 0

    def __init__(self, fn, generator):
        type(self).captures += 1
        self.fn = fn

    def replay(self):
        return self.fn()


def _sampler(seed: int = 0) -> StaticSampler:
    csr = LocalCSR.from_numpy(*power_law_graph())
    return StaticSampler(csr, (5, 4), StaticShape.bound(64, (5, 4), csr.num_nodes),
                         generator=torch.Generator().manual_seed(seed))


def test_a_replayed_sampling_graph_gives_the_eager_static_batches():
    """The warm-up and the capture put the generator back: the batches are those of a sampler never warmed up."""
    graph, eager = SampleGraph(_sampler(), capture=_RerunSampling), _sampler()
    graph.prepare()
    assert graph.graph is not None and graph.failed is None
    for seeds in (torch.randperm(1500)[:64], torch.tensor([3, 8, 1]), torch.randperm(1500)[:64]):
        batch = graph(seeds)
        want = eager.sample(torch.cat([seeds, torch.zeros(64 - seeds.numel(), dtype=torch.long)]),
                            torch.tensor(seeds.numel()))
        assert torch.equal(batch.edge_index, want.edge_index) and torch.equal(batch.n_id, want.n_id)
        assert batch.static and batch.real_batch_size == seeds.numel() and batch.batch_size == graph.shape.nodes[0]
        assert int(batch.padding_rows) == graph.shape.num_nodes - int(want.real_nodes)
        assert int(batch.real_edges) == int(want.real_edges)
        assert batch.edge_index.data_ptr() != want.edge_index.data_ptr()
    with pytest.raises(ValueError, match="a batch of 65 seeds"):
        graph(torch.arange(65))


def test_a_failed_sampling_capture_samples_eagerly_with_the_same_batches():
    """A capture that ended cleanly (out of memory inside it): the static sampler runs eagerly, same batches."""
    def refuse(fn, generator):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    graph, eager = SampleGraph(_sampler(), capture=refuse), SampleGraph(_sampler(), capture=_RerunSampling)
    graph.prepare()
    eager.prepare()
    assert graph.graph is None and graph.failed.startswith("the capture failed: OutOfMemoryError")
    seeds = torch.randperm(1500)[:64]
    assert torch.equal(graph(seeds).edge_index, eager(seeds).edge_index)


def test_an_invalidated_sampling_capture_stops_the_rank_and_leaves_the_generator_alone():
    """CUDA invalidated the capture: the generator is mid-capture, so its state is not put back (that call would
    itself fail and hide the cause), and the error reaches the rank, which stops with its one line."""
    def broken(fn, generator):
        raise graphed.CaptureBrokenError("a CUDA graph capture failed (RuntimeError: x): set cuda_graph=off")
    sampler = _sampler()
    before = sampler.generator.get_state()
    graph = SampleGraph(sampler, capture=broken)
    with pytest.raises(graphed.CaptureBrokenError, match="set cuda_graph=off"):
        graph.prepare()
    assert not torch.equal(sampler.generator.get_state(), before), "the warm-ups' draws were not undone"
    assert graph.failed is None and graph.graph is None


def test_a_static_sampler_that_fails_its_warm_up_leaves_the_pass_to_the_eager_sampler(one_rank_group, tmp_path,
                                                                                         monkeypatch):
    """Out of memory in the static sampler's first run, say: the pass samples eagerly (padding its batches for
    the graphed step), and the report says why."""
    def oom(self, seed_gid, num_seeds):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(graphed, "CudaGraphOf", Rerun)
    monkeypatch.setattr(StaticSampler, "sample", oom)
    trainer = lone_trainer(tmp_path, "oom", cuda_graph="auto")
    trainer.not_graphed, trainer.not_graphed_sampling = None, None
    trainer.rng.seed_epoch(0)
    sums = trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 3), 3, epoch=0)
    assert sums.batches == 3 and sums.padding_rows == 0 and trainer._sample_graph is None
    trainer.history = [{"val_metric": 0.5}]
    assert trainer.metrics([0.0, 1.0], [0.0, 1.0], False, None, [{}])["graphed_sampling"] == \
        "off: the static sampler failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_a_static_sampler_whose_buffers_do_not_fit_leaves_the_run_to_the_eager_sampler(one_rank_group, tmp_path,
                                                                                          monkeypatch):
    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 420.00 MiB")
    monkeypatch.setattr(graphed, "CudaGraphOf", Rerun)
    monkeypatch.setattr("stages.train.rank.trainer.make_sample_graph", no_room)
    trainer = lone_trainer(tmp_path, "noroom", cuda_graph="auto")
    trainer.not_graphed, trainer.not_graphed_sampling = None, None
    trainer.rng.seed_epoch(0)
    assert trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 3), 3, epoch=0).batches == 3
    assert trainer.not_graphed_sampling.startswith("the static sampler's buffers do not fit: OutOfMemoryError")
    assert len(trainer.evaluate("valid")) == 2, "evaluation samples eagerly too"


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_pass_on_graphed_sampling_trains_as_the_padded_eager_sampling(one_rank_group, tmp_path, monkeypatch,
                                                                         prefetch):
    """Fanouts of the largest degree draw nothing, so both samplers give the same batches: the same sums, the same
    weights within rounding, and feature counters of the real rows only (every row cached, as a lone GPU's)."""
    monkeypatch.setattr(graphed, "CudaGraphOf", Rerun)
    monkeypatch.setattr(graphed_sampling, "_cuda_capture", _RerunSampling)
    _RerunSampling.captures = 0
    results = []
    for mode in ("padded", "static"):
        trainer = lone_trainer(tmp_path, mode, graph=low_degree_graph(), fanouts=(4, 4), prefetch=prefetch)
        trainer.data.features.build_cache(torch.arange(1500))
        trainer.not_graphed = None   # as on a CUDA rank with cuda_graph=auto
        trainer.not_graphed_sampling = None if mode == "static" else "cuda_graph=step"
        trainer.rng.seed_epoch(0)
        batches = list(trainer.loader.train_batches())
        trainer.data.features.reset_counters()
        sums = trainer.run_batches(batches, len(batches), epoch=0)
        counters = trainer.data.features.reset_counters()
        results.append((sums, counters, {k: v.clone() for k, v in trainer.model.state_dict().items()}))
    (padded, c_padded, w_padded), (static, c_static, w_static) = results
    assert _RerunSampling.captures == 1
    assert static.padding_rows > 0 and padded.padding_rows == 0
    assert (static.batches, static.seeds, static.sampled_edges) == (padded.batches, padded.seeds, padded.sampled_edges)
    assert static.metric_sums == padded.metric_sums
    assert static.loss_sum == pytest.approx(padded.loss_sum, rel=1e-5)
    assert c_static == c_padded, "the counters see the real rows only"
    for k in w_padded:
        torch.testing.assert_close(w_static[k], w_padded[k], rtol=1e-5, atol=1e-6)


def test_the_sampling_graph_serves_every_pass_and_the_report_says_so(one_rank_group, tmp_path, monkeypatch):
    monkeypatch.setattr(graphed, "CudaGraphOf", Rerun)
    monkeypatch.setattr(graphed_sampling, "_cuda_capture", _RerunSampling)
    _RerunSampling.captures = 0
    trainer = lone_trainer(tmp_path, "passes", cuda_graph="auto")
    trainer.data.features.build_cache(torch.arange(1500))
    trainer.not_graphed, trainer.not_graphed_sampling = None, None
    for epoch in range(2):
        trainer.rng.seed_epoch(epoch)
        trainer.optimizer.param_groups[0]["lr"] /= 2   # a new step capture each pass; the sampling graph stays
        trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 3), 3, epoch=epoch)
    assert _RerunSampling.captures == 1
    trainer.history = [{"val_metric": 0.5}]
    assert trainer.metrics([0.0, 1.0], [0.0, 1.0], False, None, [{}])["graphed_sampling"] == "on"


def test_which_ranks_sample_through_a_graph(one_rank_group, tmp_path, monkeypatch):
    csr = LocalCSR.from_numpy(*power_law_graph())
    ok = {"csr": csr, "fanouts": [5, 4], "num_nodes": 1500, "every_row_on_device": True, "setting": "auto"}
    assert why_not_graphed_sampling(None, **ok) is None
    assert why_not_graphed_sampling("a CPU rank", **ok) == "the step is not graphed (a CPU rank)"
    assert why_not_graphed_sampling(None, **{**ok, "setting": "step"}) == "cuda_graph=step"
    assert "only part of the feature rows" in why_not_graphed_sampling(None, **{**ok, "every_row_on_device": False})
    assert "fanout -1" in why_not_graphed_sampling(None, **{**ok, "fanouts": [5, -1]})
    monkeypatch.setattr(graphed_sampling, "_torch_version", lambda: (2, 6))
    assert why_not_graphed_sampling(None, **ok).startswith("torch ")
    trainer = lone_trainer(tmp_path, "cpu", cuda_graph="auto")
    trainer.history = [{"val_metric": 0.5}]
    assert trainer.metrics([0.0, 1.0], [0.0, 1.0], False, None, [{}])["graphed_sampling"] == \
        "off: the step is not graphed (a CPU rank)"


@pytest.mark.parametrize("cached", [False, True])
def test_the_trainer_asks_whether_every_feature_row_is_on_the_device(one_rank_group, tmp_path, monkeypatch, cached):
    """The rank's own answer (``DistFeatures.holds_every_row``) decides, the step's graph given."""
    from stages.train.rank import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "why_not_graphed", lambda *a, **k: None)   # as on a lone CUDA rank
    from tests._block_graphs import one_rank_data

    real_one_rank_data = one_rank_data

    def data_with_cache(graph=None):
        data = real_one_rank_data(graph)
        if cached:
            data.features.build_cache(torch.arange(1500))
        return data
    monkeypatch.setattr("tests._graphed_cases.one_rank_data", data_with_cache)
    trainer = lone_trainer(tmp_path, f"wired{cached}", cuda_graph="auto")
    if cached:
        assert trainer.not_graphed_sampling is None
    else:
        assert "only part of the feature rows" in trainer.not_graphed_sampling


@pytest.mark.parametrize("prefetch", [0, 1])
def test_evaluation_samples_through_the_graph_with_the_eager_result(one_rank_group, tmp_path, monkeypatch, prefetch):
    """A rank whose sampling is graphed evaluates on its static batches too (the test pass of products is ~2 160
    batches): without draws, the same metric sums as the eager sampler's, padding and short batches included."""
    monkeypatch.setattr(graphed, "CudaGraphOf", Rerun)
    monkeypatch.setattr(graphed_sampling, "_cuda_capture", _RerunSampling)
    _RerunSampling.captures = 0
    sums = []
    for mode in ("eager", "static"):
        trainer = lone_trainer(tmp_path, f"eval{mode}", graph=low_degree_graph(), fanouts=(4, 4), prefetch=prefetch)
        trainer.data.features.build_cache(torch.arange(1500))
        if mode == "static":
            trainer.not_graphed, trainer.not_graphed_sampling = None, None   # as on a CUDA rank, cuda_graph=auto
        sums.append((trainer.evaluate("valid"), trainer.test()))
    assert _RerunSampling.captures == 1, "the static run sampled through the graph"
    assert sums[1] == sums[0] and sums[0][0][1] == 1500, sums
