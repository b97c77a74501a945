"""The static-shape sampler (``stages.runtime.sampling.static_sampler``): every batch in the padded layout, no host
read.

Without draws (every fanout at least every degree) it must give the padded eager batch exactly; with draws, a
valid batch of the eager kernel's law: real edges of the graph, a uniform subset per row, first-occurrence node
order, fake slots that never reach a real one. Its capture: ``tests/test_gpu_graphed.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.relabel import SENTINEL
from stages.runtime.sampling.sampler import NeighborSampler
from stages.runtime.sampling.static_sampler import StaticSampler, why_not_static
from stages.runtime.sampling.static_shape import StaticShape
from stages.train.rank.static_batch import pad_batch
from tests._graphed_cases import low_degree_graph
from tests._sampler_graphs import edge_keys, power_law_graph

CPU = torch.device("cpu")



def _seed_buffer(seeds: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    buf = torch.full((size,), 12345, dtype=torch.long)   # stale entries past the real seeds: ignored
    buf[:seeds.numel()] = seeds
    return buf, torch.tensor(seeds.numel())


def _sample(sampler: StaticSampler, seeds: torch.Tensor):
    return sampler.sample(*_seed_buffer(seeds, sampler.capacity[0]))


@pytest.mark.parametrize("fanouts", [(4, 4), (4, 5, 6)])
def test_without_draws_it_is_the_padded_eager_batch(fanouts):
    csr = LocalCSR.from_numpy(*low_degree_graph())
    shape = StaticShape.bound(32, fanouts, csr.num_nodes)
    static = StaticSampler(csr, fanouts, shape)
    eager = NeighborSampler(csr, fanouts)
    fake_edges = shape.fake_edge_index(CPU)
    for seeds in (torch.randperm(csr.num_nodes)[:32], torch.tensor([5, 1, 9]), torch.arange(32), torch.arange(0)):
        batch = eager.sample(seeds)
        padded = pad_batch(batch, shape, fake_edges)
        got = _sample(static, seeds)
        assert torch.equal(got.edge_index, padded.edge_index)
        n_id = torch.zeros(shape.num_nodes, dtype=torch.long).index_copy_(0, padded.pad_pos, batch.n_id)
        assert torch.equal(got.n_id, n_id)
        assert got.level_nodes.tolist() == batch.num_sampled_nodes
        assert (int(got.real_nodes), int(got.real_edges)) == (batch.n_id.numel(), batch.edge_index.shape[1])


def _real_part(got, shape: StaticShape) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each level's real gids and each hop's real edges (padded positions), checking the padding on the way."""
    starts = [0, *itertools.accumulate(shape.nodes)]
    levels = got.level_nodes.tolist()
    real_pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, levels)])
    is_real = torch.zeros(shape.num_nodes, dtype=torch.bool)
    is_real[real_pos] = True
    assert bool((got.n_id[~is_real] == 0).all()), "a fake slot's n_id is 0"
    hops, lo = [], 0
    dst = got.edge_index[1]
    assert bool((dst[1:] >= dst[:-1]).all()), "grouped by target, in frontier order"
    for h, e_pad in enumerate(shape.edges):
        edges = got.edge_index[:, lo:lo + e_pad]
        real = is_real[edges[1]]
        n_real = int(real.sum())
        assert bool(real[:n_real].all()) and not bool(real[n_real:].any()), "real edges first"
        assert bool(is_real[edges[0, :n_real]].all()) and not bool(is_real[edges[0, n_real:]].any())
        assert bool((edges[1, :n_real] >= starts[h]).all() and (edges[1, :n_real] < starts[h] + levels[h]).all())
        hops.append(edges[:, :n_real])
        lo += e_pad
    return [got.n_id[s:s + n] for s, n in zip(starts, levels)], hops


@pytest.mark.parametrize(("fanouts", "replace"), [((5, 4, 3), False), ((3, 2), True), ((15,), False)])
def test_with_draws_every_batch_is_a_valid_sample(fanouts, replace):
    indptr, indices = power_law_graph()
    csr = LocalCSR.from_numpy(indptr, indices)
    keys = edge_keys(indptr, indices)
    deg = np.diff(indptr)
    shape = StaticShape.bound(64, fanouts, csr.num_nodes)
    static = StaticSampler(csr, fanouts, shape, replace=replace, generator=torch.Generator().manual_seed(0))
    for seeds in (torch.randperm(csr.num_nodes)[:64], torch.tensor([3, 1490]), torch.arange(64)):   # hub, isolated
        got = _sample(static, seeds)
        levels, hops = _real_part(got, shape)
        assert torch.equal(levels[0], seeds)
        seen = torch.cat(levels)
        assert seen.unique().numel() == seen.numel(), "every real gid once"
        for h, (edges, k) in enumerate(zip(hops, fanouts)):
            src_gid, dst_gid = got.n_id[edges[0]].numpy(), got.n_id[edges[1]].numpy()
            assert np.isin(dst_gid * csr.num_nodes + src_gid, keys).all(), "only edges of the graph"
            frontier = levels[h].numpy()
            want = np.where(deg[frontier] > 0, k, 0) if replace else np.minimum(deg[frontier], k)
            start = sum(shape.nodes[:h])   # level h's first padded slot
            assert (np.bincount(edges[1].numpy() - start, minlength=frontier.size) == want).all()
            if not replace:
                pairs = dst_gid * csr.num_nodes + src_gid
                assert np.unique(pairs).size == pairs.size, "a subset: no neighbour twice"
            # the new gids of the hop are its sources' first occurrences, in slot order, not seen before
            new = [g for g in dict.fromkeys(src_gid.tolist()) if g not in set(torch.cat(levels[:h + 1]).tolist())]
            assert new == levels[h + 1].tolist()
        assert (int(got.real_nodes), int(got.real_edges)) == (seen.numel(), sum(e.shape[1] for e in hops))


@pytest.mark.parametrize("replace", [False, True])
def test_a_hubs_neighbours_are_drawn_uniformly(replace):
    """gid 3's ~300 neighbours, 3 000 draws of 5: each neighbour's share within 5 standard deviations."""
    indptr, indices = power_law_graph()
    csr = LocalCSR.from_numpy(indptr, indices)
    shape = StaticShape.bound(1, (5,), csr.num_nodes)
    static = StaticSampler(csr, (5,), shape, replace=replace, generator=torch.Generator().manual_seed(1))
    deg, trials = int(indptr[4] - indptr[3]), 3000
    counts = np.zeros(csr.num_nodes)
    for _ in range(trials):
        got = _sample(static, torch.tensor([3]))
        src = got.n_id[got.edge_index[0, :5]]
        if not replace:
            assert src.unique().numel() == 5
        np.add.at(counts, src.numpy(), 1)
    share = counts[indices[indptr[3]:indptr[4]]] / trials
    p = 5 / deg
    assert np.abs(share - p).max() < 5 * np.sqrt(p * (1 - p) / trials)
    assert counts.sum() == 5 * trials


def test_batches_forget_each_other_and_repeat_for_the_same_draws():
    csr = LocalCSR.from_numpy(*power_law_graph())
    shape = StaticShape.bound(64, (5, 4), csr.num_nodes)
    gen = torch.Generator().manual_seed(2)
    static = StaticSampler(csr, (5, 4), shape, generator=gen)
    a, b = torch.randperm(csr.num_nodes)[:64], torch.randperm(csr.num_nodes)[:40]
    state = gen.get_state()
    first = _sample(static, a)
    first = (first.n_id.clone(), first.edge_index.clone())
    _sample(static, b)
    gen.set_state(state)
    again = _sample(static, a)
    assert torch.equal(again.n_id, first[0]) and torch.equal(again.edge_index, first[1])
    other = StaticSampler(csr, (5, 4), shape, generator=torch.Generator().manual_seed(2))
    fresh = _sample(other, a)
    assert torch.equal(fresh.n_id, first[0]) and torch.equal(fresh.edge_index, first[1])


def test_what_the_static_sampler_refuses():
    indptr, indices = power_law_graph()
    csr = LocalCSR.from_numpy(indptr, indices)
    n = csr.num_nodes
    assert why_not_static(csr, [5, 4], n) is None
    part = LocalCSR.from_numpy(indptr[:11] - indptr[0], indices[:indptr[10]], start_gid=0)
    assert "one partition of several" in why_not_static(part, [5], n)
    assert "fanout -1" in why_not_static(csr, [5, -1], n)
    assert "per edge type" in why_not_static(csr, [(2, 3)], n)
    weighted = LocalCSR.from_numpy(indptr, indices).with_edge_weight(torch.ones(indices.shape[0]))
    assert "edge-weighted" in why_not_static(weighted, [5], n)
    empty = LocalCSR.from_numpy(np.zeros(5, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert "without edges" in why_not_static(empty, [5], 4)
    with pytest.raises(ValueError, match="cannot sample this graph"):
        StaticSampler(csr, [5, -1], StaticShape.bound(4, (5, 5), n))
    with pytest.raises(ValueError, match="a shape of 2 hops for 1 fanouts"):
        StaticSampler(csr, [5], StaticShape.bound(4, (5, 5), n))
    with pytest.raises(ValueError, match="cannot hold the up to 9 new nodes"):   # a shape made for a smaller graph
        StaticSampler(csr, [9, 2], StaticShape.bound(1, (9, 2), 4))


def test_fake_slots_spread_their_writes_and_leave_no_trace():
    """Every write of a fake slot lands on a spare entry, spread over many (one address would queue a GPU's
    writes), and the next batch resets what the last one wrote: no table entry of the graph stays set."""
    csr = LocalCSR.from_numpy(*power_law_graph())
    static = StaticSampler(csr, (5, 4), StaticShape.bound(64, (5, 4), csr.num_nodes))
    got = _sample(static, torch.tensor([1490, 1491]))   # isolated seeds: every other slot is fake
    assert int(got.real_nodes) == 2 and int(got.real_edges) == 0
    assert int((static.table[csr.num_nodes:] != SENTINEL).sum()) > 100, "the spares took the fake writes"
    _sample(static, torch.arange(0))
    static.sample(torch.zeros(64, dtype=torch.long), torch.tensor(0))
    assert bool((static.table[:csr.num_nodes] == SENTINEL).all())


def test_the_sampler_benchmark_counts_a_static_batchs_real_edges(tmp_path):
    """``bench_sampler.py --static``: sampled edges/s of the real edges, not the padded slots (the same law as the
    eager sampler's, so about as many a batch)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    results = []
    for static in ([], ["--static"]):
        done = subprocess.run([sys.executable, str(repo / "benchmarks" / "bench_sampler.py"), "--nodes", "3000",
                               "--avg-degree", "8", "--graph", str(tmp_path / "g.npz"), "--batch-size", "64",
                               "--batches", "4", "--threads", "1", *static], cwd=repo, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    eager, static_result = results
    assert static_result["static"] and not eager["static"]
    slots = StaticShape.bound(64, (15, 10, 5), 3000).num_edges
    assert static_result["edges_per_batch"] < slots / 2
    assert abs(static_result["edges_per_batch"] - eager["edges_per_batch"]) < 0.1 * eager["edges_per_batch"]
