"""The device cache's runtime budget (stages.train.rank.cache_budget, issue [4/5] item 1): a GPU rank fills its free
memory after a reserve, a CPU rank keeps the hotness plan's size, the train caps bound both; the cache takes that
many rows of the policy's ranking, which past the pre-sampled rows goes on by in-degree to every row. The GPU's
side is read through an injected ``free_bytes`` here; tests/test_gpu_train.py runs it on a device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.hotness.plan import degree_order
from stages.train.params import Params
from stages.train.rank.cache_budget import (
    FIXED_RESERVE_BYTES,
    FREE_MARGIN,
    cache_budget,
    graph_placement,
    largest_batch_nodes,
    reserve_bytes,
)
from stages.train.rank.cache_policy import bytes_within, cache_gids, full_ranking, rows_within
from storage import ArtifactStore
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from tests._train_pipeline import build_upstream

GPU, CPU = torch.device("cuda", 0), torch.device("cpu")   # a device object needs no device
GiB = 2**30


def test_the_largest_batch_is_bounded_by_the_fanouts_and_the_graph():
    p = Params(batch_size=4, fanouts=(2, 3))
    assert largest_batch_nodes(p, 1000) == 4 + 8 + 24
    assert largest_batch_nodes(p, 20) == 20
    assert largest_batch_nodes(Params(batch_size=4, fanouts=(2, -1)), 1000) == 1000   # -1: every neighbour


def test_products_features_fit_one_h100_with_no_flag():
    """ogbn-products on one H100 (79.2 GiB, ~78 free once the CSR is there): its 0.96 GB of float32 rows fit."""
    products = Params()   # SAGE 3 x 256, [15, 10, 5], batch 1024: the recipe
    nodes = largest_batch_nodes(products, 2_449_029)
    assert nodes == 1024 * (1 + 15 + 15 * 10 + 15 * 10 * 5)
    reserve = reserve_bytes(products, in_features=100, num_nodes=2_449_029)
    assert reserve == 16 * 3 * 2 * 257 * 256 + nodes * 4 * (100 + 3 * 256 * 3) + FIXED_RESERVE_BYTES
    budget = cache_budget(products, GPU, own_feature_bytes=979_611_600, in_features=100, num_nodes=2_449_029,
                          free_bytes=lambda device: 78 * GiB)
    assert budget.bytes == int(FREE_MARGIN * 78 * GiB) - reserve and budget.bytes > 979_611_600
    assert budget.why.startswith("device: 0.9 × 78.0 GiB free")


def test_caps_bound_the_device_and_a_cpu_rank_keeps_the_plan():
    def budget(device: torch.device, free: int = 40 * GiB, **caps: float | int) -> int | None:
        return cache_budget(Params(**caps), device, own_feature_bytes=10 * GiB, in_features=100, num_nodes=10**6,
                            free_bytes=lambda d: free).bytes

    assert budget(CPU) is None, "CPU ranks: the hotness plan's size, as before"
    assert budget(CPU, device_cache_ratio=0.25) == int(0.25 * 10 * GiB)
    assert budget(CPU, device_cache_ratio=0.25, device_cache_bytes=1000) == 1000, "the smaller cap"
    assert budget(GPU, device_cache_ratio=0.25) == int(0.25 * 10 * GiB), "a cap below what the device leaves"
    assert budget(GPU, device_cache_bytes=10**15) < 40 * GiB, "a cap above it leaves the device's figure"
    assert budget(GPU, free=GiB) == 0, "less free than the reserve: no cache, not a negative one"
    reserve = reserve_bytes(Params(), in_features=100, num_nodes=10**6)
    assert budget(GPU, ranks_per_gpu=2) == int(FREE_MARGIN * 40 * GiB / 2) - reserve, "ranks sharing a GPU share it"


def test_bytes_within_walks_rows_of_several_widths():
    widths = np.array([400, 0, 100])   # three node types; the second's rows are learnt: no cache holds them
    type_of = np.array([0, 1, 2, 0, 2, 1, 0])
    fit = bytes_within(1000, lambda gid: widths[type_of[gid]])
    assert fit(np.arange(7)) == 6      # 400 + 0 + 100 + 400 + 100 = 1000, then gid 5's 0 bytes; gid 6's 400 do not
    assert fit(np.array([0, 3, 6])) == 2
    assert rows_within(3)(np.arange(7)) == 3 and rows_within(30)(np.arange(7)) == 7


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> tuple[PartitionArtifact, HotnessArtifact]:
    store = ArtifactStore(tmp_path_factory.mktemp("cache-budget") / "art")
    manifests = build_upstream(store, 2)
    return (PartitionArtifact(store, manifests["partition"]), HotnessArtifact(store, manifests["hotness"]))


def test_a_budget_takes_the_rankings_first_rows_and_all_of_them_at_most(artifacts):
    partition, hotness = artifacts
    plan = hotness.plan(0)
    num_nodes = int(partition.bounds()[-1])
    as_planned = cache_gids("hotness", partition=partition, hotness=hotness, rank=0)
    assert np.array_equal(as_planned, plan.plan_gid), "no budget: the plan, as before"
    m = int(plan.plan_gid.shape[0])
    same = cache_gids("hotness", partition=partition, hotness=hotness, rank=0, fit=rows_within(m))
    assert np.array_equal(same, plan.plan_gid), "the plan is the ranking's first rows"
    every = cache_gids("hotness", partition=partition, hotness=hotness, rank=0, fit=rows_within(10 * num_nodes))
    assert np.array_equal(np.sort(every), np.arange(num_nodes)), "a budget of the whole graph caches every row"
    k = int(plan.ranked_gid.shape[0])
    assert k < num_nodes, "the fixture must leave rows that pre-sampling never requested"
    assert np.array_equal(every[:k], plan.ranked_gid)
    in_degree = partition.in_degree()
    assert np.all(np.diff(in_degree[every[k:]]) <= 0), "the rest by in-degree"
    assert np.array_equal(full_ranking(plan.ranked_gid, in_degree), every)
    lo, hi = (int(b) for b in partition.bounds()[:2])
    remote = cache_gids("hotness-remote", partition=partition, hotness=hotness, rank=0, fit=rows_within(5))
    assert remote.shape == (5,) and np.all((remote < lo) | (remote >= hi))
    by_degree = cache_gids("degree", partition=partition, hotness=hotness, rank=0, fit=rows_within(7))
    assert np.array_equal(by_degree, degree_order(in_degree)[:7])


def test_the_csr_goes_to_the_device_when_it_fits_its_budget_else_to_pinned_memory():
    """Issue [4/5] item 7: placed before the cache, against the same budget; a CPU rank keeps it in RAM and a
    choice by name is kept. (tests/test_gpu_paths.py samples a pinned CSR on a GPU.)"""
    params = Params(hidden=256, fanouts=(15, 10, 5), batch_size=1024)
    shape = {"in_features": 100, "num_nodes": 2_400_000}
    reserve = reserve_bytes(params, **shape)
    free = 80 * GiB
    fill = int(FREE_MARGIN * free) - reserve

    def place(csr_bytes: int, p: Params = params, device: torch.device = GPU):
        return graph_placement(p, device, csr_bytes=csr_bytes, free_bytes=lambda _: free, **shape)

    assert place(fill).mode == "device" and "fits the device budget" in place(fill).why
    assert place(fill + 1).mode == "uva" and "sampled through UVA" in place(fill + 1).why
    assert place(10 * GiB).why.startswith("auto: 10.00 GiB of CSR fits the device budget (0.9 × 80.0 GiB free")
    assert place(fill + 1, device=CPU).mode == "cpu"
    for choice in ("device", "uva"):   # kept whatever the budget says
        assert place(fill + 1, params.model_copy(update={"graph_placement": choice})).mode == choice
    shared = params.model_copy(update={"ranks_per_gpu": 2})   # each of two ranks on the card: half the free memory
    assert place(fill // 2, shared).mode == "uva" and "/ 2 ranks" in place(fill // 2, shared).why


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where no CUDA device is")
def test_a_pinned_csr_asked_for_without_a_gpu_fails_in_one_line():
    from stages.runtime.csr import LocalCSR
    from stages.train.rank.rank_data import place_csr
    from storage.errors import InputError

    csr = LocalCSR.from_numpy(np.array([0, 1, 2]), np.array([1, 0]))
    assert csr.nbytes == 3 * 8 + 2 * 8
    with pytest.raises(InputError, match="^graph_placement=uva: a CSR sampled in place needs a CUDA device"):
        place_csr(csr, Params(graph_placement="uva"), GPU, in_features=4, num_nodes=2)
    same, placed = place_csr(csr, Params(), CPU, in_features=4, num_nodes=2)
    assert placed.mode == "cpu" and torch.equal(same.indices, csr.indices)
