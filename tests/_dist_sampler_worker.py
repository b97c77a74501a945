"""The ranks' side of ``test_dist_sampler`` (kept free of pytest/scipy: every spawned rank imports this module)."""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.dist_sampler import DistNeighborSampler, equal_batch_count, iter_equal_seed_batches
from tests._sampler_graphs import BOUNDS, NUM_NODES, power_law_graph, split_csr

WORLD_SIZE = 2
TIMEOUT_S = 90
SMALL_FANOUTS = [5, 3]
EPOCHS = 3
BATCH_SIZE = 32
UNEVEN_TRAIN = {"zero": [150, 0], "both": [100, 250]}   # train seeds per rank


def fields_of(batch) -> dict:
    return {"n_id": batch.n_id, "edge_index": batch.edge_index, "batch_size": batch.batch_size,
            "num_sampled_nodes": batch.num_sampled_nodes, "num_sampled_edges": batch.num_sampled_edges,
            "edges_by_target": batch.edges_by_target}


def run_scenarios(rank: int) -> dict:
    graph = power_law_graph()
    indptr, indices = split_csr(*graph, BOUNDS)[rank]
    csr = LocalCSR.from_numpy(indptr, indices, BOUNDS[rank])
    max_deg = int(np.diff(graph[0]).max())
    own_gid = torch.arange(BOUNDS[rank], BOUNDS[rank + 1])

    def sampler(fanouts, seed=0, replace=False):
        gen = torch.Generator().manual_seed(seed + rank)
        return DistNeighborSampler(csr, BOUNDS, fanouts, replace=replace, generator=gen)

    out: dict = {}
    # seeds anywhere in the graph (owned elsewhere, isolated, empty batch): every rank runs the same batch count
    pick = torch.Generator().manual_seed(100 + rank)
    exact_seeds = [torch.randperm(NUM_NODES, generator=pick)[:n] for n in (1, 16, 40)]
    exact_seeds += [torch.arange(NUM_NODES - 5, NUM_NODES) if rank else torch.tensor([3]), torch.empty(0).long()]
    for name, fanouts in (("full", [max_deg, max_deg]), ("all", [-1, -1])):
        smp = sampler(fanouts)
        out[name] = [(seed_gid, fields_of(smp.sample(seed_gid))) for seed_gid in exact_seeds]

    # small fanouts over a few epochs of this rank's own seeds, then the first epoch again with the same seeds
    for name, epochs in (("small", EPOCHS), ("small_again", 1)):
        smp, gen = sampler(SMALL_FANOUTS), torch.Generator().manual_seed(7 + rank)
        out[name] = [(seed_gid, fields_of(smp.sample(seed_gid))) for _ in range(epochs)
                     for seed_gid in iter_equal_seed_batches(own_gid, BATCH_SIZE, generator=gen)]
    smp = sampler(SMALL_FANOUTS, replace=True)
    out["replace"] = [(seed_gid, fields_of(smp.sample(seed_gid))) for seed_gid in exact_seeds]

    # uneven train splits, one of them empty: every rank must run the same number of (possibly empty) batches
    for name, sizes in UNEVEN_TRAIN.items():
        train_gid = own_gid[:sizes[rank]]
        smp, gen = sampler(SMALL_FANOUTS), torch.Generator().manual_seed(rank)
        out[f"uneven_{name}"] = [[(seed_gid, fields_of(smp.sample(seed_gid)))
                                  for seed_gid in iter_equal_seed_batches(train_gid, BATCH_SIZE, generator=gen)]
                                 for _ in range(2)]
    out["count"] = [equal_batch_count([0, 31][rank], 10), equal_batch_count([45, 0][rank], 10)]
    dist.barrier()
    return out


def worker(rank: int, init_file: str, out_dir: str) -> None:
    try:
        torch.set_num_threads(1)   # two ranks on a 2-core box
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                                timeout=timedelta(seconds=TIMEOUT_S))
        torch.save(run_scenarios(rank), Path(out_dir, f"{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - any failure of a rank is written for the parent test to show
        Path(out_dir, f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
