"""Prefetch (stages.train.rank.prefetch): the same batches and results as the synchronous path, failures that surface.

In one process: the loop's sums, weights and generator states bit for bit at depths 0, 1 and 2; a producer's
exception raised in the caller; a caller's exception stopping the producer; the learnt embeddings' ordering rule.
On 2 gloo ranks: the real trainer, prefetch off and on, node classification (GCN: degrees travel too), link
prediction with filtered negatives, and a typed graph with learnt embeddings: every epoch's metrics, the test
metrics, the weights and the generators' states equal.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from stages.train.models.model import build_model
from stages.train.rank.loop import eval_sums, train_epoch
from stages.train.rank.prefetch import PrefetchStream, batch_stream
from stages.train.tasks import NodeClassification
from storage import ArtifactStore
from tests._prefetch_worker import TIMEOUT_S, WORLD_SIZE, worker
from tests._sampler_graphs import class_graph
from tests._spawn import spawn_ranks
from tests._train_pipeline import build_upstream, build_without_prefect, train_params

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def producers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gnnpipe-prefetch" and t.is_alive()]


def run_epochs(depth: int, epochs: int = 3, device: str = "cpu") -> dict[str, Any]:
    """Train ``epochs`` epochs with dropout (torch's global stream, drawn in the caller's thread) and evaluate."""
    dev = torch.device(device)
    csr, x, y = class_graph()
    csr = LocalCSR(csr.start_gid, csr.indptr.to(dev), csr.indices.to(dev), csr.num_edge_types)
    x, y = x.to(dev), y.to(dev)
    sampler_gen, shuffle_gen = torch.Generator(dev).manual_seed(1), torch.Generator(dev).manual_seed(2)
    sampler = NeighborSampler(csr, [5, 5], generator=sampler_gen)
    torch.manual_seed(0)
    model = build_model("sage", in_channels=3, hidden=16, out_channels=3, num_layers=2, dropout=0.3).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    task = NodeClassification(lambda s: y[s])
    train_gid = torch.arange(0, 300, device=dev)
    losses = []
    for _ in range(epochs):
        sums = train_epoch(model, opt, iter_seed_batches(train_gid, 40, generator=shuffle_gen), sampler.sample,
                           lambda n_id: x[n_id], task, num_real_batches=8, device=dev, prefetch=depth)
        losses.append((sums.loss_sum, sums.metric_sums, sums.seeds, sums.batches, sums.sampled_edges))
    test_gid = torch.arange(300, 600, device=dev)
    evaluated = eval_sums(model, [test_gid[:150], test_gid[:0], test_gid[150:]], sampler.sample,
                          lambda n_id: x[n_id], task, prefetch=depth, device=dev)
    return {"losses": losses, "eval": evaluated, "weights": [p.detach().cpu() for p in model.parameters()],
            "gens": [sampler_gen.get_state(), shuffle_gen.get_state(), torch.get_rng_state(),
                     *([torch.cuda.get_rng_state(dev)] if dev.type == "cuda" else [])]}


def assert_same_run(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["losses"] == want["losses"] and got["eval"] == want["eval"]
    assert all(torch.equal(a, b) for a, b in zip(got["weights"], want["weights"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got["gens"], want["gens"], strict=True)), "generator states"


def test_prefetch_trains_on_the_same_batches_bit_for_bit(one_torch_thread):
    sync = run_epochs(0)
    for depth in (1, 2):
        assert_same_run(run_epochs(depth), sync)
    assert not producers_alive(), "each pass's producer ends with the pass"


def test_prefetch_by_default_is_one_on_a_lone_gpu_rank_only():
    from stages.train.params import Params

    auto = Params()
    assert auto.prefetch is None
    assert auto.prefetch_depth("cuda", 1) == 1, "measured 1.23x on one H100 (benchmarks/RESULTS.md)"
    assert auto.prefetch_depth("cuda", 2) == 0 and auto.prefetch_depth("cpu", 1) == 0
    assert Params(prefetch=0).prefetch_depth("cuda", 1) == 0 and Params(prefetch=2).prefetch_depth("cpu", 4) == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetch_on_cuda_side_streams_gives_the_same_batches():
    assert_same_run(run_epochs(1, device="cuda"), run_epochs(0, device="cuda"))
    assert not producers_alive()


class BoomError(RuntimeError):
    pass


def test_an_exception_in_the_producer_is_raised_in_the_caller(one_torch_thread):
    csr, x, y = class_graph()
    sampler = NeighborSampler(csr, [5], generator=torch.Generator().manual_seed(0))
    calls: list[int] = []

    def sample(seed_gid):
        calls.append(len(calls))
        if len(calls) == 3:
            raise BoomError("sampling batch 2 failed")
        return sampler.sample(seed_gid)

    model = build_model("sage", in_channels=3, hidden=8, out_channels=3, num_layers=1, dropout=0.0)
    opt = torch.optim.Adam(model.parameters())
    batches = [torch.arange(b * 10, (b + 1) * 10) for b in range(6)]
    trained: list[int] = []
    with pytest.raises(BoomError, match="sampling batch 2 failed"):
        train_epoch(model, opt, batches, sample, lambda n_id: x[n_id], NodeClassification(lambda s: y[s]),
                    num_real_batches=6, device=torch.device("cpu"), on_batch=trained.append, prefetch=1)
    assert trained == [0, 1], "batches before the failed one ran, in order"
    assert not producers_alive()


def test_an_exception_in_the_caller_stops_the_producer(one_torch_thread):
    csr, x, y = class_graph()
    sampler = NeighborSampler(csr, [5], generator=torch.Generator().manual_seed(0))
    sampled: list[int] = []

    def sample(seed_gid):
        sampled.append(1)
        return sampler.sample(seed_gid)

    class CheckLoss:
        def __call__(self, b: int, loss: torch.Tensor) -> None:
            if b == 1:
                raise BoomError("loss guard")

        def finish(self) -> None:
            raise AssertionError("the pass did not end")

    model = build_model("sage", in_channels=3, hidden=8, out_channels=3, num_layers=1, dropout=0.0)
    batches = [torch.arange(b * 10, (b + 1) * 10) for b in range(20)]
    with pytest.raises(BoomError, match="loss guard"):
        train_epoch(model, torch.optim.Adam(model.parameters()), batches, sample, lambda n_id: x[n_id],
                    NodeClassification(lambda s: y[s]), num_real_batches=20, device=torch.device("cpu"),
                    check_loss=CheckLoss(), prefetch=2)
    assert not producers_alive()
    assert len(sampled) <= 2 + 2, "the producer runs at most depth batches ahead of the caller, then stops"


@pytest.mark.parametrize("depth", [1, 2])
def test_rows_updated_by_a_step_are_gathered_after_it(depth):
    """Learnt embeddings: batch b's rows are gathered after batch b - 1's step (which may update them), while its
    sampling may run ahead."""
    steps = 0
    seen: list[int] = []

    def prepare(item, before_gather):
        before_gather()
        seen.append(steps)   # steps done when this batch's rows are gathered
        return item

    with batch_stream([torch.tensor([b]) for b in range(6)], prepare, depth=depth, device=torch.device("cpu"),
                      gather_after_step=True) as stream:
        assert isinstance(stream, PrefetchStream)
        for b, _ in enumerate(stream):
            assert seen[b] == b
            steps += 1
    assert seen == list(range(6))


# ---- 2 gloo ranks, the real trainer -----------------------------------------------------------------------------
NODE = {"dataset": "synthetic", "num_nodes": 3000, "avg_degree": 8.0, "num_features": 16, "num_classes": 4,
        "seed": 1, "split": (0.3, 0.1, 0.6)}
LINK = {"dataset": "synthetic-link", "task": "link", "num_nodes": 2000, "avg_degree": 8.0, "num_features": 16,
        "num_classes": 8, "download.seed": 1, "link_split": (0.6, 0.1, 0.3)}
TYPED = {"dataset": "synthetic-hetero", "num_nodes": 3000, "avg_degree": 8.0, "num_features": 16, "num_classes": 4,
         "seed": 1, "split": (0.3, 0.1, 0.6)}
# the other rooms of [7/7] through the producer too: edge rows riding with the sampler's answers, weighted
# sampling, int8 rows decoded after the producer's exchange
EDGES_INT8 = {"dataset": "synthetic", "num_nodes": 3000, "avg_degree": 8.0, "num_features": 16, "num_classes": 4,
              "download.seed": 1, "split": (0.3, 0.1, 0.6), "num_edge_features": 2, "features.dtype": "int8"}
RUNS = {"node-gcn": (NODE, {"model": "gcn"}),
        "edges-int8-gat": (EDGES_INT8, {"model": "gat", "gat_heads": 2, "edge_weight": 0}),
        "link-filtered": (LINK, {"task": "link", "filter_negatives": True, "num_negatives": 2,
                                 "eval_negatives": 20, "edges_per_epoch": 2000, "eval_edges": 400}),
        "typed-embeddings": (TYPED, {"model": "rgcn"})}


def upstream(root, graph: dict[str, Any]) -> dict[str, str]:
    if "download.seed" in graph:   # in the config's own names, beyond the download stage's
        values = {k: v for k, v in graph.items()}
        _, manifests = build_without_prefect({**values, "artifacts": root, "num_partitions": WORLD_SIZE,
                                              "fanouts": (5, 5), "batch_size": 64, "until": "hotness"})
    else:
        manifests = build_upstream(ArtifactStore(root), WORLD_SIZE, graph)
    return {name: manifests[name].key for name in ("partition", "features", "hotness")}


@pytest.mark.parametrize("run", list(RUNS))
def test_trainer_with_prefetch_equals_the_synchronous_trainer(tmp_path, run):
    graph, overrides = RUNS[run]
    root = str(tmp_path / "artifacts")
    keys = upstream(root, graph)
    params = train_params(epochs=2, hidden=16, fanouts=(5, 5), **overrides).model_dump(mode="json")
    ranks = spawn_ranks(worker, (root, keys, params, str(tmp_path / "work")), tmp_path, WORLD_SIZE, TIMEOUT_S)
    for out in ranks:
        sync, ahead = out["0"], out["1"]
        for got, want in zip(ahead["metrics"]["epochs"], sync["metrics"]["epochs"], strict=True):
            fields = [k for k in want if not k.endswith("_s")]   # wall times differ
            assert {k: got[k] for k in fields} == {k: want[k] for k in fields}, got["epoch"]
        for field in ("test_metric", "test_metric_last", "test_metrics", "best_val_metric", "best_epoch"):
            assert ahead["metrics"][field] == sync["metrics"][field], field
        assert ahead["state"].keys() == sync["state"].keys()
        assert all(torch.equal(ahead["state"][k], sync["state"][k]) for k in sync["state"]), "weights"
        for stream in ("torch", "shuffle", "sampler"):
            assert torch.equal(ahead["rng"][stream], sync["rng"][stream]), stream
