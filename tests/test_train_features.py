"""Feature store, device cache and the distributed row gather, checked against the source graph's ``x``.

Three gloo ranks (spawned) gather the rows of sampled batches through every combination of store (RAM, on-demand
Zarr) and cache policy (hotness plan, degree, none); the rows must equal ``x[orig_of_gid[n_id]]`` whichever source
served them, and the counters must show that cache, local store and remote owners all served some.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_cache import FeatureCache
from stages.runtime.feature_store import (
    InMemoryFeatureStore,
    ZarrFeatureStore,
    fit_in_budget,
    host_budget,
    open_feature_store,
)
from storage import ArtifactStore
from storage.features import FeaturesArtifact
from storage.graph import GraphArtifact
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from tests._spawn import spawn_ranks as _spawn_ranks
from tests._train_features_worker import MODES, TIMEOUT_S, WORLD_SIZE, worker
from tests._train_pipeline import GRAPH, build_upstream

SMALL = {**GRAPH, "num_nodes": 3000}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    store = ArtifactStore(tmp_path_factory.mktemp("art"))
    manifests = build_upstream(store, WORLD_SIZE, SMALL, chunk_rows=256)   # several chunks: the Zarr path reads many
    graph = GraphArtifact(store, manifests["download"]).read()
    book = PartitionArtifact(store, manifests["partition"]).book()
    return store, manifests, graph.x[book.orig_of_gid], book   # x_of_gid: row g is gid g's features


def spawn_ranks(target, args: tuple, tmp, world: int = WORLD_SIZE, timeout_s: float = TIMEOUT_S) -> list[dict]:
    return _spawn_ranks(target, args, tmp, world, timeout_s)


@pytest.fixture(scope="module")
def ranks_out(built, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    store, manifests, _, _ = built
    keys = {name: m.key for name, m in manifests.items()}
    return spawn_ranks(worker, (store.root, keys), tmp_path_factory.mktemp("feat_ranks"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_gathered_rows_equal_the_source_rows(ranks_out, built, mode):
    x_of_gid = built[2]
    for out in ranks_out:
        res = out[mode]
        assert len(res["batches"]) > 0
        for n_id, rows in res["batches"]:
            assert rows.dtype == torch.float32 and rows.shape == (n_id.numel(), x_of_gid.shape[1])
            assert np.array_equal(rows.numpy(), x_of_gid[n_id.numpy()])
        odd, odd_rows = res["odd"]
        assert np.array_equal(odd_rows.numpy(), x_of_gid[odd.numpy()])
        assert np.array_equal(res["cache_rows"].numpy(), x_of_gid[res["cache_gid"].numpy()])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["memory-hotness", "zarr-hotness", "memory-degree", "memory-hotness-remote"])
def test_cache_local_and_remote_sources_all_serve_rows(ranks_out, mode):
    for rank, out in enumerate(ranks_out):
        c = out[mode]["counters"]
        assert c["cache_hits"] > 0 and c["local_rows"] > 0 and c["remote_rows"] > 0, (rank, c)
        assert c["requested_rows"] == c["cache_hits"] + c["local_rows"] + c["remote_rows"]
        assert c["remote_bytes"] == c["remote_rows"] * out[mode]["row_bytes"]


@pytest.mark.slow
def test_store_modes_and_policies(ranks_out, built):
    store, manifests, _, book = built
    for rank, out in enumerate(ranks_out):
        assert out["memory-hotness"]["store_kind"] == "memory" and out["zarr-hotness"]["store_kind"] == "zarr"
        plan = HotnessArtifact(store, manifests["hotness"]).plan(rank)
        assert torch.equal(out["memory-hotness"]["cache_gid"], torch.from_numpy(np.sort(plan.plan_gid)))
        own = (plan.plan_gid >= book.bounds[rank]) & (plan.plan_gid < book.bounds[rank + 1])
        assert 0 < own.sum() < plan.plan_gid.size, "the plan holds local and remote rows"
        assert out["memory-degree"]["cache_gid"].numel() == plan.plan_gid.size, "equal budget"
        remote_only = out["memory-hotness-remote"]
        cached = remote_only["cache_gid"].numpy()
        assert 0 < cached.size <= plan.plan_gid.size
        assert not ((cached >= book.bounds[rank]) & (cached < book.bounds[rank + 1])).any(), "remote rows only"
        assert remote_only["counters"]["remote_rows"] < out["memory-hotness"]["counters"]["remote_rows"]
        none = out["zarr-none"]["counters"]
        assert none["cache_hits"] == 0 and out["zarr-none"]["cache_gid"].numel() == 0
        assert none["remote_rows"] > out["memory-hotness"]["counters"]["remote_rows"], "the cache saves traffic"


def test_zarr_store_gathers_like_memory(built):
    store, manifests, x_of_gid, book = built
    x = FeaturesArtifact(store, manifests["features"]).x(1)
    mem, lazy = open_feature_store(x), open_feature_store(x, memory_budget_bytes=0)
    assert isinstance(mem, InMemoryFeatureStore) and isinstance(lazy, ZarrFeatureStore) and lazy.chunk_rows == 256
    rng = np.random.default_rng(0)
    lid = torch.from_numpy(rng.integers(0, mem.num_rows, 700))   # unsorted, repeats, many chunks
    lo = int(book.bounds[1])
    expected = x_of_gid[lo + lid.numpy()]
    assert np.array_equal(mem.gather(lid).numpy(), expected)
    assert np.array_equal(lazy.gather(lid).numpy(), expected)
    assert lazy.gather(torch.empty(0, dtype=torch.long)).shape == (0, mem.num_features)
    with pytest.raises(IndexError, match="lids must lie in"):
        lazy.gather(torch.tensor([mem.num_rows]))


def test_several_stores_share_one_host_budget():
    """A typed rank's featured types fit one budget together, the smallest first (each had all of it before)."""
    assert fit_in_budget({"paper": 500, "author": 300, "venue": 10}, 400) == {"venue", "author"}
    assert fit_in_budget({"paper": 500, "author": 300, "venue": 10}, 1000) == {"paper", "author", "venue"}
    assert fit_in_budget({"paper": 500}, 499) == set() and fit_in_budget({}, 0) == set()
    assert host_budget(123, ranks_on_host=4) == 123 and host_budget(None, ranks_on_host=2) > 0


def test_cache_lookup_by_gid():
    rows = torch.arange(12, dtype=torch.float32).view(4, 3)
    cache = FeatureCache(torch.tensor([2, 5, 9, 40]), rows)
    hit, slot = cache.lookup(torch.tensor([5, 6, 40, 41, 0, 2]))
    assert hit.tolist() == [True, False, True, False, False, True]
    assert slot[hit].tolist() == [1, 3, 0]
    empty = FeatureCache.empty(3, torch.float32, torch.device("cpu"))
    assert not empty.lookup(torch.tensor([1, 2])).__getitem__(0).any()
    with pytest.raises(ValueError, match="sorted and unique"):
        FeatureCache(torch.tensor([3, 1]), rows[:2])


def _one_rank_features(built, device: str) -> tuple[DistFeatures, np.ndarray]:
    """A whole-graph store on one rank without a process group: the single-process path."""
    x_of_gid = built[2]
    x_store = InMemoryFeatureStore(torch.from_numpy(x_of_gid.copy()))
    return DistFeatures(x_store, [0, x_of_gid.shape[0]], device=device), x_of_gid


def test_one_rank_without_process_group(built):
    features, x_of_gid = _one_rank_features(built, "cpu")
    features.build_cache(torch.tensor([7, 3, 3, 100]))
    n_id = torch.tensor([3, 5, 100, 5, 2999])
    assert np.array_equal(features.gather(n_id).numpy(), x_of_gid[n_id.numpy()])
    c = features.reset_counters()
    assert (c.cache_hits, c.local_rows, c.remote_rows, c.requested_rows) == (2, 3, 0, 5)
    assert c.hit_rate == pytest.approx(0.4) and features.counters.requested_rows == 0
    features.build_cache(torch.tensor([5, 2999]))   # every miss of n_id cached now: no fetch from the store
    assert np.array_equal(features.gather(n_id).numpy(), x_of_gid[n_id.numpy()])
    assert (features.reset_counters().cache_hits, features.counters.local_rows) == (3, 0)


def test_one_rank_with_every_row_cached_gathers_by_gid(built):
    """The device budget's aim on one GPU: every row cached, the gid its slot (no lookup, no store)."""
    features, x_of_gid = _one_rank_features(built, "cpu")
    features.build_cache(torch.randperm(features.num_nodes))
    features._fill = lambda *_: pytest.fail("read the store")   # type: ignore[method-assign]
    n_id = torch.tensor([2999, 0, 5, 5, 1234])
    assert np.array_equal(features.gather(n_id).numpy(), x_of_gid[n_id.numpy()])
    c = features.reset_counters()
    assert (c.cache_hits, c.local_rows, c.remote_rows, c.requested_rows) == (5, 0, 0, 5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gather_on_cuda(built):
    features, x_of_gid = _one_rank_features(built, "cuda")
    features.build_cache(torch.arange(0, 3000, 7))
    for _ in range(3):   # reuses the pinned staging buffer
        n_id = torch.randint(0, 3000, (5000,))
        rows = features.gather(n_id)
        assert rows.device.type == "cuda" and np.array_equal(rows.cpu().numpy(), x_of_gid[n_id.numpy()])
    features.build_cache(torch.arange(3000))   # every row in device memory: gathered by gid
    features.reset_counters()
    rows = features.gather(n_id)
    assert rows.device.type == "cuda" and np.array_equal(rows.cpu().numpy(), x_of_gid[n_id.numpy()])
    assert features.reset_counters().local_rows == 0
