"""The ranks' side of ``test_train_features`` (kept free of pytest: every spawned rank imports this module)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import open_feature_store
from stages.runtime.sampling.dist_sampler import DistNeighborSampler, iter_equal_seed_batches
from stages.train.rank.cache_policy import cache_gids
from storage import ArtifactStore
from storage.features import FeaturesArtifact
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from tests._rank import run_gloo_rank

WORLD_SIZE = 3   # three owners: remote requests must be routed by owner, not just to 'the other rank'
TIMEOUT_S = 120
BATCHES = 4
# (feature store budget, cache policy): RAM or on-demand Zarr reads; the hotness plan, a degree cache, no cache
MODES = {"memory-hotness": (None, "hotness"), "zarr-hotness": (0, "hotness"), "memory-degree": (None, "degree"),
         "memory-hotness-remote": (None, "hotness-remote"),
         "zarr-none": (0, "none")}


def run_rank(rank: int, root: str, keys: dict[str, str]) -> dict:
    store = ArtifactStore(root)
    partition = PartitionArtifact(store, store.load("partition", keys["partition"]))
    feature_art = FeaturesArtifact(store, store.load("features", keys["features"]))
    hotness = HotnessArtifact(store, store.load("hotness", keys["hotness"]))
    bounds = partition.bounds()
    csr = LocalCSR.from_part(partition.csr(rank))
    train_gid = torch.from_numpy(feature_art.part(rank, load_x=False).split_lids["train"] + int(bounds[rank]))
    out: dict = {}
    for mode, (budget, policy) in MODES.items():
        x_store = open_feature_store(feature_art.x(rank), memory_budget_bytes=budget)
        features = DistFeatures(x_store, bounds)
        gid = cache_gids(policy, partition=partition, hotness=hotness, rank=rank)
        features.build_cache(torch.from_numpy(gid))
        sampler = DistNeighborSampler(csr, bounds, [10, 5], generator=torch.Generator().manual_seed(rank))
        seed_batches = iter_equal_seed_batches(train_gid, 64, generator=torch.Generator().manual_seed(rank))
        batches = []
        for b, seed_gid in enumerate(seed_batches):
            if b == BATCHES:
                break
            n_id = sampler.sample(seed_gid).n_id
            batches.append((n_id, features.gather(n_id)))
        batch_counters = features.reset_counters().as_dict()
        # repeated gids of every partition on rank 0, nothing on rank 1, one remote row on rank 2: lockstep holds
        odd = {0: torch.tensor([int(bounds[3]) - 1, 0, int(bounds[1]), 0, int(bounds[2]) - 1, int(bounds[3]) - 1]),
               1: torch.empty(0, dtype=torch.long), 2: torch.tensor([0])}[rank]
        odd_rows = features.gather(odd)
        out[mode] = {"batches": batches, "counters": batch_counters, "odd": (odd, odd_rows),
                     "store_kind": x_store.kind, "cache_gid": features.cache.gid_sorted.clone(),
                     "cache_rows": features.cache.rows.clone(), "row_bytes": x_store.row_bytes}
    dist.barrier()
    return out


def worker(rank: int, init_file: str, out_dir: str, root: str, keys: dict[str, str]) -> None:
    run_gloo_rank(rank, init_file, out_dir, WORLD_SIZE, TIMEOUT_S, lambda: run_rank(rank, root, keys))
