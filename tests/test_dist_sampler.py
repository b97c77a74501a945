"""Distributed sampler on 2 gloo ranks (spawned processes) against the single-partition sampler.

One spawn runs every scenario (starting ranks costs seconds); the ranks save what they sampled and the tests
below check it. A rank that raises, or a run that hangs past ``TIMEOUT_S``, fails every test here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.dist_sampler import DistNeighborSampler, iter_equal_seed_batches
from stages.runtime.sampling.sampler import NeighborSampler
from tests._dist_sampler_worker import BATCH_SIZE, SMALL_FANOUTS, TIMEOUT_S, UNEVEN_TRAIN, WORLD_SIZE, fields_of, worker
from tests._sampler_graphs import BOUNDS, NUM_NODES, check_batch, power_law_graph
from tests._spawn import spawn_ranks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks_out(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("dist_sampler")
    return spawn_ranks(worker, (), tmp, WORLD_SIZE, TIMEOUT_S)


@pytest.fixture(scope="module")
def graph() -> tuple[np.ndarray, np.ndarray]:
    return power_law_graph()


def _edge_pairs(fields: dict) -> set[tuple[int, int]]:
    n_id, edge_index = fields["n_id"], fields["edge_index"]
    return set(zip(n_id[edge_index[0]].tolist(), n_id[edge_index[1]].tolist()))


def _single(graph, fanouts, seed=0, replace=False) -> NeighborSampler:
    return NeighborSampler(LocalCSR.from_numpy(*graph), fanouts, replace=replace,
                           generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["full", "all"])
def test_full_fanouts_match_the_single_partition_sampler(ranks_out, graph, name):
    max_deg = int(np.diff(graph[0]).max())
    single = _single(graph, [max_deg, max_deg] if name == "full" else [-1, -1])
    for out in ranks_out:
        for seed_gid, fields in out[name]:
            ref = single.sample(seed_gid)
            assert torch.equal(fields["n_id"][:fields["batch_size"]], seed_gid)
            assert set(fields["n_id"].tolist()) == set(ref.n_id.tolist())
            assert _edge_pairs(fields) == _edge_pairs(fields_of(ref))
            assert fields["edge_index"].shape == ref.edge_index.shape
            assert fields["num_sampled_nodes"] == ref.num_sampled_nodes
            assert fields["num_sampled_edges"] == ref.num_sampled_edges
            # each hop's answers come grouped by owner rank: the blocks must check and sort them
            assert ref.edges_by_target and not fields["edges_by_target"]


def _as_batch(fields: dict):
    from torch_geometric.data import Data

    return Data(num_nodes=fields["n_id"].numel(), **fields)


@pytest.mark.parametrize("name,fanouts,replace", [("small", SMALL_FANOUTS, False), ("replace", SMALL_FANOUTS, True),
                                                   ("full", None, False)])
def test_batches_are_in_the_documented_id_spaces(ranks_out, graph, name, fanouts, replace):
    for out in ranks_out:
        for seed_gid, fields in out[name]:
            check_batch(_as_batch(fields), seed_gid, graph, fanouts=fanouts, replace=replace)


def test_small_fanouts_give_the_single_sampler_distribution(ranks_out, graph):
    single = _single(graph, SMALL_FANOUTS, seed=123)
    dist_nodes, single_nodes = [], []
    for out in ranks_out:
        for seed_gid, fields in out["small"]:
            dist_nodes.append(fields["n_id"].numel())
            single_nodes.append(single.sample(seed_gid).num_nodes)
    assert len(dist_nodes) >= 100
    assert stats.ks_2samp(dist_nodes, single_nodes).pvalue > 1e-3
    assert stats.mannwhitneyu(dist_nodes, single_nodes).pvalue > 1e-3


def test_sampling_is_deterministic_per_rank_seed(ranks_out):
    for out in ranks_out:
        assert len(out["small_again"]) >= 20
        for (seed_a, a), (seed_b, b) in zip(out["small"], out["small_again"]):
            assert torch.equal(seed_a, seed_b) and torch.equal(a["n_id"], b["n_id"])
            assert torch.equal(a["edge_index"], b["edge_index"])


@pytest.mark.parametrize("name", sorted(UNEVEN_TRAIN))
def test_uneven_train_splits_run_equal_batch_counts(ranks_out, graph, name):
    sizes = UNEVEN_TRAIN[name]
    expected = -(-max(sizes) // BATCH_SIZE)
    for rank, out in enumerate(ranks_out):
        own_train = set(range(BOUNDS[rank], BOUNDS[rank] + sizes[rank]))
        for epoch in out[f"uneven_{name}"]:
            assert len(epoch) == expected
            seeds = [seed_gid for seed_gid, _ in epoch]
            real = -(-sizes[rank] // BATCH_SIZE)
            covered = torch.cat([*seeds[:real], torch.empty(0, dtype=torch.long)])
            assert set(covered.tolist()) == own_train, "each epoch covers the split once"
            for i, (seed_gid, fields) in enumerate(epoch):
                size = sizes[rank] - i * BATCH_SIZE if i < real else sizes[rank]   # real batches, then padding
                assert seed_gid.numel() == min(BATCH_SIZE, size)
                assert torch.unique(seed_gid).numel() == seed_gid.numel()
                assert set(seed_gid.tolist()) <= own_train, "padding recycles the rank's own seeds"
                check_batch(_as_batch(fields), seed_gid, graph, fanouts=SMALL_FANOUTS)
    assert ranks_out[0]["count"] == ranks_out[1]["count"] == [4, 5]


def test_one_rank_is_exactly_the_single_sampler_without_a_collective(one_rank_group, graph, monkeypatch):
    def no_collective(*args, **kwargs):
        raise AssertionError("a 1-rank sampler exchanges nothing")

    monkeypatch.setattr("stages.runtime.sampling.dist_sampler.all_to_all", no_collective)
    csr = LocalCSR.from_numpy(*graph)
    edge_attr = torch.randn(csr.indices.numel(), 3)
    dist_sampler = DistNeighborSampler(csr, [0, NUM_NODES], [10, 5], generator=torch.Generator().manual_seed(3))
    single = _single(graph, [10, 5], seed=3)
    for sampler in (dist_sampler, single):   # the sampled edges' egids and rows travel too
        sampler.with_edges, sampler.edge_attr = True, edge_attr
    for seed_gid in iter_equal_seed_batches(torch.arange(0, NUM_NODES, 4), 50,
                                            generator=torch.Generator().manual_seed(0)):
        a, b = dist_sampler.sample(seed_gid), single.sample(seed_gid)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert torch.equal(a.e_id, b.e_id) and torch.equal(a.edge_attr, b.edge_attr)
    empty = dist_sampler.sample(torch.empty(0, dtype=torch.long))
    assert empty.num_sampled_nodes == [0, 0, 0] and tuple(empty.edge_index.shape) == (2, 0)


def test_partition_mismatch_is_rejected(one_rank_group, graph):
    indptr, indices = graph
    with pytest.raises(ValueError, match="partitions for 1 ranks"):
        DistNeighborSampler(LocalCSR.from_numpy(indptr, indices), BOUNDS, [5])
    part = LocalCSR.from_numpy(indptr[:701] - indptr[0], indices[:indptr[700]], 0)
    with pytest.raises(ValueError, match="holds gids"):
        DistNeighborSampler(part, [0, NUM_NODES], [5])
    with pytest.raises(ValueError, match="fanout"):
        DistNeighborSampler(LocalCSR.from_numpy(indptr, indices), [0, NUM_NODES], [5, 0])
