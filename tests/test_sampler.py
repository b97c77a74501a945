"""Single-partition neighbour sampler: kernel correctness, uniformity, multi-hop batches and ID spaces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.relabel import make_node_map, unique_first_occurrence
from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from stages.runtime.sampling.uniform import sample_neighbors
from tests._sampler_graphs import (
    NUM_NODES,
    assert_same_batches,
    check_batch,
    edge_keys,
    expected_counts,
    power_law_graph,
)

HUB_GID = 3


@pytest.fixture(scope="module")
def graph() -> tuple[np.ndarray, np.ndarray]:
    return power_law_graph()


@pytest.fixture(scope="module")
def csr(graph) -> LocalCSR:
    return LocalCSR.from_numpy(*graph)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _neighbors(graph, gid: int) -> np.ndarray:
    indptr, indices = graph
    return indices[indptr[gid]:indptr[gid + 1]]


def test_graph_has_the_shapes_the_tests_need(graph):
    deg = np.diff(graph[0])
    assert deg[HUB_GID] >= 250 and (deg == 0).sum() >= 20 and ((deg > 0) & (deg <= 5)).sum() > 100


@pytest.mark.parametrize("fanout", [1, 5, 15, 40, -1])
@pytest.mark.parametrize("replace", [False, True])
def test_sampled_edges_exist_with_the_right_counts(graph, csr, fanout, replace):
    target_lid = torch.arange(NUM_NODES)
    row_pos, nbr_gid = sample_neighbors(csr, target_lid, fanout, replace=replace, generator=_gen())
    assert row_pos.dtype == nbr_gid.dtype == torch.long
    assert bool((row_pos[1:] >= row_pos[:-1]).all()), "grouped by target in target order"
    keys = target_lid[row_pos].numpy() * NUM_NODES + nbr_gid.numpy()
    assert np.isin(keys, edge_keys(*graph)).all(), "every sampled edge exists in the graph"
    deg = np.diff(graph[0])
    count = np.bincount(row_pos.numpy(), minlength=NUM_NODES)
    np.testing.assert_array_equal(count, expected_counts(deg, fanout, replace))
    if not replace:
        assert np.unique(keys).shape == keys.shape, "no duplicate neighbours per target"


@pytest.mark.parametrize("fanout", [5, 40])
def test_low_degree_targets_get_all_neighbours(graph, csr, fanout):
    deg = np.diff(graph[0])
    target_lid = torch.from_numpy(np.flatnonzero(deg <= fanout))
    row_pos, nbr_gid = sample_neighbors(csr, target_lid, fanout, generator=_gen())
    for i in range(0, target_lid.numel(), 37):
        got = np.sort(nbr_gid[row_pos == i].numpy())
        np.testing.assert_array_equal(got, np.sort(_neighbors(graph, int(target_lid[i]))))


# Floyd with a small and a large fanout (both below the hub degree), and independent draws with replacement
@pytest.mark.parametrize("fanout,replace", [(5, False), (100, False), (5, True)])
def test_neighbour_frequencies_are_uniform(graph, csr, fanout, replace):
    hub_nbr_gid = _neighbors(graph, HUB_GID)
    draws = 3000
    target_lid = torch.full((draws,), HUB_GID)     # repeated targets are sampled independently
    row_pos, nbr_gid = sample_neighbors(csr, target_lid, fanout, replace=replace, generator=_gen(1))
    assert nbr_gid.numel() == draws * fanout
    slot = np.searchsorted(hub_nbr_gid, nbr_gid.numpy())          # rows are sorted: position in the row
    freq = np.bincount(slot, minlength=hub_nbr_gid.shape[0])
    assert stats.chisquare(freq).pvalue > 1e-3


def test_without_replacement_subsets_are_uniform():
    # one target with 6 neighbours, fanout 3: all C(6, 3) = 20 subsets equally likely (Floyd is exact)
    csr = LocalCSR.from_numpy(np.array([0, 6]), np.arange(10, 16))
    draws = 4000
    row_pos, nbr_gid = sample_neighbors(csr, torch.zeros(draws, dtype=torch.long), 3, generator=_gen(2))
    subsets = [tuple(sorted(s)) for s in nbr_gid.view(draws, 3).tolist()]
    index = {s: i for i, s in enumerate(itertools.combinations(range(10, 16), 3))}
    freq = np.bincount([index[s] for s in subsets], minlength=len(index))
    assert stats.chisquare(freq).pvalue > 1e-3


def test_floyd_repeats_by_jumping_are_the_steps_picks(monkeypatch):
    """The GPU's pointer jumping finds the same repeats as Floyd's steps, to the last pick: every k from 1 to 25 and
    degrees from k + 1 (many repeats) to hubs, on the same draws."""
    from stages.runtime.sampling.uniform import floyd_offsets

    cases = 0
    for trial in range(600):
        g = _gen(trial)
        k = 1 + trial % 25
        rows = int(torch.randint(1, 60, (1,), generator=g))
        deg = k + 1 + torch.randint(0, (1, 3, 10, 10_000)[trial % 4], (rows,), generator=g)
        steps = floyd_offsets(deg, k, _gen(trial), by_jumping=False)
        jumps = floyd_offsets(deg, k, _gen(trial), by_jumping=True)
        assert torch.equal(steps, jumps), (trial, k)
        assert bool((steps < deg).all()) and all(len(set(col.tolist())) == k for col in steps.T)
        cases += int((deg <= k + 3).sum())
    assert cases > 1000, "rows whose draws mostly repeat"

    def no_jumping(*args):
        raise AssertionError("a CPU takes the steps")
    monkeypatch.setattr("stages.runtime.sampling.uniform._repeats_by_jumping", no_jumping)
    floyd_offsets(torch.tensor([20, 40]), 15, _gen(1))


def test_empty_targets_and_isolated_nodes(csr):
    row_pos, nbr_gid = sample_neighbors(csr, torch.empty(0, dtype=torch.long), 5, generator=_gen())
    assert row_pos.numel() == nbr_gid.numel() == 0
    isolated_lid = torch.arange(NUM_NODES - 20, NUM_NODES)
    for replace in (False, True):
        row_pos, nbr_gid = sample_neighbors(csr, isolated_lid, 5, replace=replace, generator=_gen())
        assert row_pos.numel() == nbr_gid.numel() == 0


@pytest.mark.parametrize("fanouts", [[], [0], [-2], [15, 0, 5], [10, -3]])
def test_invalid_fanouts_are_rejected(csr, fanouts):
    with pytest.raises(ValueError, match="fanout"):
        NeighborSampler(csr, fanouts)


def test_invalid_kernel_fanout_and_duplicate_seeds(csr):
    with pytest.raises(ValueError, match="fanout"):
        sample_neighbors(csr, torch.arange(3), 0)
    with pytest.raises(ValueError, match="unique"):
        NeighborSampler(csr, [5]).sample(torch.tensor([1, 2, 1]))
    with pytest.raises(ValueError, match=r"\[0, 1500\)"):
        NeighborSampler(csr, [5]).sample(torch.tensor([1, NUM_NODES]))


@pytest.mark.parametrize("node_map", ["dense", "sorted"])
def test_seeds_the_caller_checked_give_the_same_batches(csr, node_map):
    """``checked=True`` (a loader whose items were checked once) skips the two per-batch checks, nothing else:
    the same batches, draw for draw; unchecked, the checks still hold."""
    plain = NeighborSampler(csr, [10, 5], generator=_gen(), node_map=node_map)
    trusted = NeighborSampler(csr, [10, 5], generator=_gen(), node_map=node_map)
    for seed_gid in iter_seed_batches(torch.arange(0, NUM_NODES, 3), 64, generator=_gen()):
        a, b = plain.sample(seed_gid), trusted.sample(seed_gid, checked=True)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    with pytest.raises(ValueError, match="unique"):
        trusted.sample(torch.tensor([1, 2, 1]))


@pytest.mark.parametrize("node_map", ["dense", "sorted"])
def test_multi_hop_batches_are_in_the_documented_id_spaces(graph, csr, node_map):
    sampler = NeighborSampler(csr, [10, 5, 3], generator=_gen(), node_map=node_map)
    for seed_gid in iter_seed_batches(torch.arange(0, NUM_NODES, 3), 64, generator=_gen()):
        check_batch(sampler.sample(seed_gid), seed_gid, graph, fanouts=[10, 5, 3])


def test_node_maps_agree_and_sampling_is_deterministic(csr):
    seed_gid = torch.randperm(NUM_NODES, generator=_gen(5))[:100]
    dense = NeighborSampler(csr, [10, 5], generator=_gen(7), node_map="dense").sample(seed_gid)
    sorted_ = NeighborSampler(csr, [10, 5], generator=_gen(7), node_map="sorted").sample(seed_gid)
    other = NeighborSampler(csr, [10, 5], generator=_gen(8)).sample(seed_gid)
    for key in ("n_id", "edge_index"):
        assert torch.equal(dense[key], sorted_[key])
    assert not torch.equal(dense.edge_index, other.edge_index)
    for replace in (False, True):
        a = NeighborSampler(csr, [10, 5], replace=replace, generator=_gen(3)).sample(seed_gid)
        b = NeighborSampler(csr, [10, 5], replace=replace, generator=_gen(3)).sample(seed_gid)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)


def test_int32_and_int64_indices_sample_the_same_batches(graph):
    """The CSR's index width is storage only: the batches are the same (the CPU run of the helper that the
    pinned-vs-device CUDA test uses, so its seeds are checked here too)."""
    indptr, indices = graph
    assert_same_batches(LocalCSR.from_numpy(indptr, indices.astype(np.int64)),
                        LocalCSR.from_numpy(indptr, indices.astype(np.int32)), torch.device("cpu"))


def _k_hop(graph, seed_gid: np.ndarray, hops: int) -> tuple[set[int], set[tuple[int, int]]]:
    """Reference: every node within ``hops`` (following incoming edges) and every edge into a node < hops away."""
    indptr, indices = graph
    reached, frontier, edges = set(seed_gid.tolist()), seed_gid.tolist(), set()
    for _ in range(hops):
        new = []
        for v in frontier:
            for u in indices[indptr[v]:indptr[v + 1]].tolist():
                edges.add((u, v))
                if u not in reached:
                    reached.add(u)
                    new.append(u)
        frontier = new
    return reached, edges


def test_full_fanouts_give_the_whole_k_hop_neighbourhood(graph, csr):
    seed_gid = torch.tensor([HUB_GID, 17, 400, 1200, NUM_NODES - 1])
    max_deg = int(np.diff(graph[0]).max())
    for fanouts in ([-1, -1], [max_deg, max_deg]):
        batch = NeighborSampler(csr, fanouts, generator=_gen()).sample(seed_gid)
        nodes, edges = _k_hop(graph, seed_gid.numpy(), 2)
        assert set(batch.n_id.tolist()) == nodes
        got = set(zip(batch.n_id[batch.edge_index[0]].tolist(), batch.n_id[batch.edge_index[1]].tolist()))
        assert got == edges and len(edges) == batch.edge_index.shape[1]


def test_empty_seed_batch(csr):
    batch = NeighborSampler(csr, [5, 5]).sample(torch.empty(0, dtype=torch.long))
    assert batch.batch_size == 0 and batch.n_id.numel() == 0 and tuple(batch.edge_index.shape) == (2, 0)
    assert batch.num_sampled_nodes == [0, 0, 0] and batch.num_sampled_edges == [0, 0]


def test_seed_iterator_shuffles_per_epoch():
    train_gid = torch.arange(100, 350)
    gen = _gen(11)
    epochs = [list(iter_seed_batches(train_gid, 64, generator=gen)) for _ in range(2)]
    for batches in epochs:
        assert [b.numel() for b in batches] == [64, 64, 64, 58]
        assert torch.equal(torch.sort(torch.cat(batches)).values, train_gid)
    assert not torch.equal(torch.cat(epochs[0]), torch.cat(epochs[1]))
    again = list(iter_seed_batches(train_gid, 64, generator=_gen(11)))
    assert all(torch.equal(a, b) for a, b in zip(again, epochs[0]))
    assert [b.numel() for b in iter_seed_batches(train_gid, 64, generator=gen, drop_last=True)] == [64] * 3


def test_unique_first_occurrence_matches_a_python_reference():
    gid = torch.randint(0, 50, (400,), generator=_gen(4))
    uniq, inverse = unique_first_occurrence(gid)
    assert uniq.tolist() == list(dict.fromkeys(gid.tolist()))
    assert torch.equal(uniq[inverse], gid)
    node_map = make_node_map(50, kind="dense")
    node_map.start(torch.tensor([7, 3]))
    cand_pos, new_gid = node_map.add(gid)
    ref_new = [g for g in dict.fromkeys(gid.tolist()) if g not in (7, 3)]
    assert new_gid.tolist() == ref_new
    assert torch.equal(torch.cat([torch.tensor([7, 3]), new_gid])[cand_pos], gid)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_contract(graph):
    csr = LocalCSR.from_numpy(*graph, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    seed_gid = torch.arange(0, NUM_NODES, 7, device="cuda")
    batch = NeighborSampler(csr, [10, 5], generator=gen).sample(seed_gid)
    assert batch.n_id.device.type == batch.edge_index.device.type == "cuda"
    check_batch(batch.cpu(), seed_gid.cpu(), graph, fanouts=[10, 5])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_floyd_on_a_gpu_jumps_to_the_steps_picks():
    from stages.runtime.sampling.uniform import floyd_offsets

    deg = torch.randint(16, 60, (5000,), device="cuda")
    for k in (5, 10, 15):   # 5: below _JUMP_FROM_K, the steps
        gen = [torch.Generator(device="cuda").manual_seed(k) for _ in range(2)]
        assert torch.equal(floyd_offsets(deg, k, gen[0]), floyd_offsets(deg, k, gen[1], by_jumping=False))
