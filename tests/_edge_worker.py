"""The ranks' side of ``test_edge_sampling`` (free of pytest: every spawned rank imports it)."""

from __future__ import annotations

import numpy as np
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.dist_sampler import DistNeighborSampler
from tests._rank import run_gloo_rank
from tests._sampler_graphs import BOUNDS, NUM_NODES, power_law_graph, split_csr

WORLD_SIZE = 2
TIMEOUT_S = 90
FANOUTS = [5, 3]


def edge_truth(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """float32 [E, 3] per egid (the whole CSR's edge order, which the parts' concatenation is): (src gid, dst gid,
    egid), exact in float32 for this graph's ~12 k edges."""
    dst_gid = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return np.stack([indices, dst_gid, np.arange(indices.shape[0])], axis=1).astype(np.float32)


def edge_bounds_of(indptr: np.ndarray) -> list[int]:
    return [int(indptr[b]) for b in BOUNDS]


def fields(batch) -> dict:
    return {"n_id": batch.n_id, "edge_index": batch.edge_index, "e_id": getattr(batch, "e_id", None),
            "edge_attr": getattr(batch, "edge_attr", None)}


def scenarios(rank: int) -> dict:
    indptr, indices = power_law_graph()
    part_indptr, part_indices = split_csr(indptr, indices, BOUNDS)[rank]
    edge_bounds = edge_bounds_of(indptr)
    csr = LocalCSR.from_numpy(part_indptr, part_indices, BOUNDS[rank], start_egid=edge_bounds[rank])
    own_attr = torch.from_numpy(edge_truth(indptr, indices)[edge_bounds[rank]:edge_bounds[rank + 1]])
    pick = torch.Generator().manual_seed(50 + rank)
    seeds = [torch.randperm(NUM_NODES, generator=pick)[:n] for n in (1, 24, 60)] + [torch.empty(0).long()]

    def run(with_edges: bool, replace: bool = False, weighted: bool = False) -> list[dict]:
        local = csr.with_edge_weight(zero_weight_free(own_attr[:, 2])) if weighted else csr
        smp = DistNeighborSampler(local, BOUNDS, FANOUTS, generator=torch.Generator().manual_seed(rank),
                                  replace=replace, num_edges=edge_bounds[-1])
        smp.with_edges, smp.edge_attr = with_edges, own_attr   # rows travel only with with_edges
        return [fields(smp.sample(seed_gid)) for seed_gid in seeds]

    return {"plain": run(False), "edges": run(True), "edges_replace": run(True, replace=True),
            "weighted": run(True, weighted=True), "weighted_replace": run(True, replace=True, weighted=True)}


def zero_weight_free(egid: torch.Tensor) -> torch.Tensor:
    """Edge weights for the weighted scenarios: 0 for every third egid (never to be sampled), else 1 + egid % 5."""
    return torch.where(egid.long() % 3 == 0, 0.0, 1.0 + egid.long() % 5)


def worker(rank: int, init_file: str, out_dir: str) -> None:
    run_gloo_rank(rank, init_file, out_dir, WORLD_SIZE, TIMEOUT_S, lambda: scenarios(rank))
