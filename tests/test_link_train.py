"""Link prediction training ([6/7]): no leakage of held-out edges, filtered negatives, uneven ranks, 1 vs 2 ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stages.download import stage as download
from stages.jobs.errors import TrainingError
from stages.runtime.csr import LocalCSR
from stages.runtime.link_batch import link_seeds
from stages.runtime.negatives import EdgeMembership, NegativeDraws
from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from stages.train import stage as train
from stages.train.rank.faults import FAULT_ENV
from stages.train.tasks.link import LinkPrediction
from stages.train.tasks.link_decoders import link_loss
from storage import ArtifactStore, InputError, Manifest
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact, concat_parts
from storage.train import METRICS
from tests._link_train_worker import TIMEOUT_S, WORLD_SIZE, worker
from tests._spawn import spawn_ranks
from tests._train_pipeline import build_without_prefect

# 3 000 nodes in 32 communities: edges mostly inside one, so a pair is predictable from its ends' features and
# neighbourhoods; ~12 000 undirected pairs, 30 % of them test positives: Hits@10 over 1 200 of them (the default
# 10 %) has a binomial std of 1.4 points a run, too coarse to tell 2 runs apart within 2 points; over 3 600, 0.8
LINK_GRAPH: dict[str, Any] = {"dataset": "synthetic-link", "task": "link", "num_nodes": 3000, "avg_degree": 8.0,
                              "num_features": 16, "num_classes": 8, "download.seed": 1, "link_split": (0.6, 0.1, 0.3)}
FANOUTS = (10, 5)


def build(root: Path, parts: int, until: str = "hotness") -> tuple[ArtifactStore, dict[str, Manifest]]:
    return build_without_prefect({**LINK_GRAPH, "artifacts": str(root), "num_partitions": parts, "fanouts": FANOUTS,
                                  "batch_size": 128, "until": until})


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, dict[str, Manifest]]:
    return build(tmp_path_factory.mktemp("link2"), 2)


def held_out_pairs(store: ArtifactStore, manifests: dict[str, Manifest]) -> set[tuple[int, int]]:
    """Every valid/test positive, as gid pairs in both directions (the graph is undirected)."""
    part = PartitionArtifact(store, manifests["partition"])
    pairs = set()
    for p in range(part.num_partitions):
        for split in ("valid", "test"):
            src, dst = part.edge_split(p, split)
            pairs |= set(zip(src.tolist(), dst.tolist())) | set(zip(dst.tolist(), src.tolist()))
    return pairs


def test_no_held_out_edge_is_reachable_in_training_samples(two_parts):
    store, m = two_parts
    part = PartitionArtifact(store, m["partition"])
    csr = LocalCSR.from_numpy(*concat_parts([part.csr(p) for p in range(2)]), start_gid=0)
    sampler = NeighborSampler(csr, [-1, -1], generator=torch.Generator().manual_seed(0))   # every in-edge, 2 hops
    draws, gen = NegativeDraws(int(part.bounds()[-1])), torch.Generator().manual_seed(1)
    held = held_out_pairs(store, m)
    assert len(held) > 1000
    sampled: set[tuple[int, int]] = set()
    train_hits = 0
    for p in range(2):
        src, dst = torch.from_numpy(part.edge_split(p, "train"))
        train = set(zip(src.tolist(), dst.tolist()))
        for item in iter_seed_batches(torch.arange(src.numel()), 256, generator=gen):
            seeds = link_seeds(src[item], dst[item], draws.draw((item.numel(), 1), gen))
            batch = sampler.sample(seeds.seed_gid)
            ends = batch.n_id[batch.edge_index]
            sampled |= set(zip(ends[0].tolist(), ends[1].tolist()))
        train_hits += len(train & sampled)
    assert not sampled & held, "a valid/test edge was sampled for training"
    assert train_hits > 0.9 * sum(part.edge_split(p, "train").shape[1] for p in range(2)), \
        "the training positives themselves are message-passing edges (the check would catch a leak)"


def test_filtered_negatives_are_never_real_edges_nor_their_positive(two_parts):
    store, m = two_parts
    part = PartitionArtifact(store, m["partition"])
    num_nodes = int(part.bounds()[-1])
    csr = LocalCSR.from_numpy(*concat_parts([part.csr(p) for p in range(2)]), start_gid=0)
    edges = {s: torch.from_numpy(np.concatenate([part.edge_split(p, s) for p in range(2)], axis=1)) for s in SPLITS}
    # negatives among the first 40 gids only: collisions with the positive and with real edges are certain
    task = LinkPrediction(edges, NegativeDraws(40), torch.Generator().manual_seed(0), num_negatives=30,
                          eval_negatives=30, membership=EdgeMembership(csr, [0, num_nodes]), loss_fn=link_loss)
    src, dst = edges["train"]
    item = torch.nonzero(dst < 40).view(-1)[:200]   # positives whose dst can be drawn as a negative
    _, target = task.batch(item, training=True)
    s, mask = target.seeds, target.neg_mask
    assert mask is not None
    seed_gid = s.seed_gid
    neg_gid, pos_dst = seed_gid[s.neg_dst_pos], seed_gid[s.dst_pos]
    real = {(u, v) for u, v in zip(*(t.tolist() for t in csr_edges(csr)))}
    neg_src = seed_gid[s.neg_src_pos]
    is_real = torch.tensor([(u, v) in real for u, v in zip(neg_src.flatten().tolist(), neg_gid.flatten().tolist())])
    is_positive = (neg_gid == pos_dst.unsqueeze(1)).flatten()
    assert bool(is_positive.any()) and bool(is_real.any()), "the draws hit both cases the filter is for"
    assert torch.equal(mask.flatten(), ~(is_real | is_positive))


def csr_edges(csr: LocalCSR) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) gids of every edge of a one-type CSR starting at gid 0."""
    dst = torch.repeat_interleave(torch.arange(csr.indptr.numel() - 1), torch.diff(csr.indptr))
    return csr.indices, dst


@pytest.mark.slow
def test_a_rank_without_positives_does_not_hang(tmp_path, two_parts):
    store, m = two_parts
    keys = {"partition": m["partition"].key, "features": m["features"].key}
    out = spawn_ranks(worker, (store.root, keys), tmp_path, WORLD_SIZE, TIMEOUT_S)
    assert out[0]["sums"].batches == out[1]["sums"].batches > 1
    assert out[1]["sums"].seeds == 0 and out[0]["sums"].seeds > 0   # rank 1's batches were all padding
    assert np.isfinite(out[0]["sums"].loss_sum)
    assert out[1]["valid"] == [0.0] * 6 and out[0]["valid"][4] > 0   # rank 1 scored nothing, rank 0 its positives
    for a, b in zip(out[0]["weights"], out[1]["weights"]):   # DDP's all-reduces paired up
        assert torch.equal(a, b)


def train_link(store: ArtifactStore, manifests: dict[str, Manifest], **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"task": "link", "hidden": 32, "fanouts": FANOUTS, "batch_size": 128, "epochs": 6,
                              "lr": 0.01, "dropout": 0.0, "num_negatives": 2, "threads_per_rank": 1,
                              "timeout_s": 300.0, "peer_timeout_s": 60.0, **overrides}
    run = train.run(store, train.Params(**values), {u: manifests[u] for u in train.UPSTREAM}, log=lambda line: None)
    return json.loads(store.read_bytes("train", run.key, METRICS))


@pytest.mark.slow
def test_two_ranks_reach_one_ranks_mrr(tmp_path, two_parts):
    store, m = two_parts
    one_store, one = build(tmp_path / "one", 1)
    assert GraphArtifact(one_store, one["download"]).manifest.key == m["download"].key   # the same split
    two_ranks = train_link(store, m)
    one_rank = train_link(one_store, one, batch_size=256)   # the same global batch: 2 ranks x 128
    assert two_ranks["task"]["metric"] == "mrr" and two_ranks["world_size"] == 2
    for name in ("mrr", "hits@1", "hits@10", "auc"):
        assert abs(two_ranks["test_metrics"][name] - one_rank["test_metrics"][name]) < 0.02, name
    # chance MRR against 100 negatives is ~0.05 (H_101 / 101); 6 epochs of 2 negatives reach ~0.19 here
    assert two_ranks["metric_name"] == "mrr" and two_ranks["test_metric"] > 0.12, two_ranks["test_metrics"]
    losses = [e["loss"] for e in two_ranks["epochs"]]
    assert losses[-1] < losses[0]


def test_link_settings_need_a_graph_split_for_them(tmp_path):
    store, m = build(tmp_path, 1)
    node_store, node = build_without_prefect({"artifacts": str(tmp_path / "node"), "num_nodes": 500,
                                              "num_features": 4, "num_classes": 2, "num_partitions": 1,
                                              "fanouts": FANOUTS, "until": "hotness"})
    with pytest.raises(InputError, match="task=link needs a graph split for it"):
        train_link(node_store, node, epochs=1)
    with pytest.raises(InputError, match="dataset synthetic-link is made for link prediction: set task=link"):
        build_without_prefect({"artifacts": str(tmp_path / "bad"), "dataset": "synthetic-link", "until": "download"})
    with pytest.raises(InputError, match="loss=cross_entropy is not a task=link loss"):
        train.Params(task="link", loss="cross_entropy")
    node_key = train.Params().key_params()
    assert node_key["loss"] == "cross_entropy" and "task" not in node_key and "decoder" not in node_key
    assert m["partition"].summary["link_edge_type"] == "node___edge___node"


@pytest.mark.slow
def test_a_typed_graph_predicts_its_chosen_edge_type(tmp_path):
    store, m = build_without_prefect({"artifacts": str(tmp_path), "dataset": "synthetic-hetero", "task": "link",
                                      "link_edge_type": "writes", "num_nodes": 3000, "num_features": 8,
                                      "num_classes": 4, "num_partitions": 2, "fanouts": FANOUTS, "batch_size": 128,
                                      "until": "hotness"})
    assert m["partition"].summary["link_edge_type"] == "author___writes___paper"
    part = PartitionArtifact(store, m["partition"])
    _, type_of_gid = part.range_table().locate(np.arange(part.schema.num_nodes))
    for p in range(2):   # positives are author -> paper, owned by the paper's partition
        src, dst = part.edge_split(p, "train")
        assert set(type_of_gid[src]) == {part.schema.type_id("author")}
        assert set(type_of_gid[dst]) == {part.schema.type_id("paper")}
        assert np.all((dst >= part.bounds()[p]) & (dst < part.bounds()[p + 1]))
    metrics = train_link(store, m, epochs=2, model="rgcn", eval_negatives=50)
    assert metrics["task"]["metric"] == "mrr" and all(np.isfinite(e["loss"]) for e in metrics["epochs"])
    # chance against 50 negatives is ~0.09; writes -> paper is predictable from the typed neighbourhoods
    assert metrics["test_metrics"]["mrr"] > 0.15, metrics["test_metrics"]


def test_a_files_graph_is_split_by_fractions_and_seed(tmp_path):
    from stages.download.synthetic import generate_synthetic
    from tests._download_cases import write_files

    graph = generate_synthetic(600, 6.0, 4, 3, 0)
    path = write_files(tmp_path / "g", graph, graph.x)
    values = {"dataset": "files", "path": str(path), "task": "link", "link_split": (0.7, 0.1, 0.2),
              "download.seed": 3, "until": "download"}
    store, m = build_without_prefect({**values, "artifacts": str(tmp_path / "a")})
    sizes = m["download"].summary["edge_split_sizes"]
    pairs = graph.num_edges // 2   # stored symmetrised: one undirected pair per two entries
    assert sum(sizes.values()) == pairs and sizes["test"] == round(0.2 * pairs)
    assert f"{sizes['test']:,} test positives (valid and test held out" in download.report(m["download"]).headline
    g = GraphArtifact(store, m["download"]).read()
    assert g.num_edges == graph.num_edges - 2 * (sizes["valid"] + sizes["test"])   # both directions held out
    other_store, again = build_without_prefect({**values, "artifacts": str(tmp_path / "b")})
    g2 = GraphArtifact(other_store, again["download"]).read()   # the same files, fractions and seed: the same split
    assert all(np.array_equal(g.edge_splits[s], g2.edge_splits[s]) for s in SPLITS)


def copy_upstream(store: ArtifactStore, manifests: dict[str, Manifest], root: Path) -> ArtifactStore:
    """A second artifact root holding the same upstream builds (same keys), and no train build yet."""
    for stage in train.UPSTREAM:
        key = manifests[stage].key
        shutil.copytree(Path(store.url(stage, key)), root / stage / key)
    return ArtifactStore(root)


@pytest.mark.slow
def test_a_killed_link_run_resumes_to_the_uninterrupted_result(tmp_path, two_parts, monkeypatch):
    store, m = two_parts
    reference = train_link(copy_upstream(store, m, tmp_path / "ref"), m, epochs=3, filter_negatives=True)
    other = copy_upstream(store, m, tmp_path / "other")
    monkeypatch.setenv(FAULT_ENV, "1:1:2")   # rank 1 SIGKILLs itself before batch 2 of epoch 2
    with pytest.raises(TrainingError, match="rank 1 was killed by SIGKILL"):
        train_link(other, m, epochs=3, filter_negatives=True)
    monkeypatch.delenv(FAULT_ENV)
    resumed = train_link(other, m, epochs=3, filter_negatives=True)
    assert resumed["resumed_from_epoch"] == 0 and reference["resumed_from_epoch"] is None
    for got, want in zip(resumed["epochs"], reference["epochs"], strict=True):
        for field in ("loss", "train_metric", "val_metric", "train_items", "remote_rows"):
            assert got[field] == want[field], (got["epoch"], field)
    assert resumed["test_metrics"] == reference["test_metrics"]
