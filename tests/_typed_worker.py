"""The ranks' side of ``test_typed_runtime``: the typed distributed sampler and the sharded embeddings on 2 gloo
ranks (kept free of pytest: every spawned rank imports this module)."""

from __future__ import annotations

import sys
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from stages.download.edge_split import edge_entries
from stages.download.synthetic_hetero import generate_synthetic_hetero
from stages.runtime.csr import LocalCSR
from stages.runtime.negatives import EdgeMembership
from stages.runtime.sampling.dist_sampler import DistNeighborSampler
from stages.runtime.sharded_embedding import ShardedEmbedding
from stages.train.rank.checkpoint import resume_part, save_part, save_replicated_part
from storage.graph import Graph
from storage.train import list_shards

WORLD_SIZE = 2
TIMEOUT_S = 120
# 3 000 nodes of 4 types, 7 edge types (with reverses); gids = orig ids, split at an arbitrary node
GRAPH = {"num_nodes": 3000, "avg_degree": 10.0, "num_features": 8, "num_classes": 4, "seed": 0}
SPLIT_AT = 1700
SEEDS_PER_RANK = 40
EMB_BOUNDS = [0, 50, 120]
EMB_DIM = 4
EMB_STEPS = 5
EMB_GATHER = 30


def typed_graph() -> Graph:
    return generate_synthetic_hetero(**GRAPH)


def part_csr(graph: Graph, rank: int) -> LocalCSR:
    """Rank r's rows of the whole graph's (node, edge type) CSR: nodes [0, SPLIT_AT) or [SPLIT_AT, N)."""
    r, n = graph.schema.num_edge_types, graph.schema.num_nodes
    lo, hi = (0, SPLIT_AT) if rank == 0 else (SPLIT_AT, n)
    indptr = graph.indptr[lo * r:hi * r + 1]
    return LocalCSR.from_numpy(indptr - indptr[0], graph.indices[indptr[0]:indptr[-1]], lo, num_edge_types=r)


def per_type_fanout(graph: Graph) -> tuple[int, ...]:
    """A hop's fanout per edge type: 1, 2, 3, ... by edge type id, the second type not sampled (0)."""
    return tuple(0 if e == 1 else e + 1 for e in range(graph.schema.num_edge_types))


def emb_draws(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tgids (any owner, with repeats) and loss coefficients at ``step``."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, EMB_BOUNDS[-1], (EMB_GATHER,), generator=gen), torch.randn((EMB_GATHER, EMB_DIM),
                                                                                      generator=gen)


def run(rank: int) -> dict:
    graph = typed_graph()
    csr = part_csr(graph, rank)
    bounds = [0, SPLIT_AT, graph.schema.num_nodes]
    seed_gid = torch.arange(bounds[rank], bounds[rank] + SEEDS_PER_RANK)
    full = DistNeighborSampler(csr, bounds, [-1, -1], generator=torch.Generator().manual_seed(rank))
    sampled = DistNeighborSampler(csr, bounds, [3, 2], generator=torch.Generator().manual_seed(rank))
    per_type = DistNeighborSampler(csr, bounds, [per_type_fanout(graph), 2],
                                   generator=torch.Generator().manual_seed(rank))
    out: dict = {"full": full.sample(seed_gid), "sampled": sampled.sample(seed_gid),
                 "per_type": per_type.sample(seed_gid), "empty": full.sample(torch.empty(0, dtype=torch.long))}
    emb = ShardedEmbedding(EMB_BOUNDS, EMB_DIM, lr=0.1, seed=3, node_type=1)
    out["emb_initial"] = emb.weight.detach().clone()
    touched = []
    for step in range(EMB_STEPS):
        tgid, coef = emb_draws(step, rank)
        rows = emb.gather(tgid)
        (rows * coef).sum().backward()
        out.setdefault("touched_rows", []).append(emb.step())
        touched.append(tgid)
    with torch.no_grad():
        out["eval_rows"] = emb.gather(torch.arange(EMB_BOUNDS[-1]))
    out["emb_final"] = emb.weight.detach().clone()
    out["touched"] = torch.cat(touched)
    out["state"] = emb.state_dict()
    out["moved_part"] = moved_part(rank)
    src, dst, edge_type = membership_queries(graph)
    out["membership"] = EdgeMembership(csr, bounds, edge_type).contains(src[rank::2], dst[rank::2])
    out["replicated_part"] = replicated_part(rank)
    return out


def membership_queries(graph: Graph) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pairs to check against the ``writes`` edges: half real edges, half uniform pairs (mostly not edges)."""
    edge_type = next(i for i, e in enumerate(graph.schema.edge_types) if e.rel == "writes")
    _, src, dst = edge_entries(graph, edge_type)
    gen = np.random.default_rng(0)
    pick = gen.choice(src.shape[0], 200, replace=False)
    n = graph.schema.num_nodes
    return (torch.from_numpy(np.concatenate([src[pick], gen.integers(0, n, 200)])),
            torch.from_numpy(np.concatenate([dst[pick], gen.integers(0, n, 200)])), edge_type)


def membership_truth(graph: Graph, src: torch.Tensor, dst: torch.Tensor, edge_type: int) -> torch.Tensor:
    """bool: is each ``src -> dst`` a type-``edge_type`` edge, read off the whole graph's rows one by one."""
    r = graph.schema.num_edge_types
    rows = dst.numpy() * r + edge_type
    return torch.tensor([int(u) in set(graph.indices[graph.indptr[row]:graph.indptr[row + 1]].tolist())
                         for u, row in zip(src.tolist(), rows)])


def moved_part(rank: int) -> dict:
    """Ranks that swapped nodes since the checkpoint: each node's directory holds the other rank's part."""
    with tempfile.TemporaryDirectory(prefix=f"node-{rank}-") as directory:
        save_part(directory, 0, 1 - rank, {"rank": 1 - rank, "rows": torch.full((3,), float(1 - rank))})
        return resume_part(directory, 0, rank=rank, world=WORLD_SIZE)


def replicated_part(rank: int) -> tuple[list[int], dict]:
    """Two nodes of one rank each: each part is written on both; then node 1's directory is lost, and rank 1
    resumes its part from node 0's copy."""
    with tempfile.TemporaryDirectory(prefix=f"node-{rank}-") as directory:
        save_replicated_part(directory, 0, {"rank": rank}, rank=rank, world=WORLD_SIZE, local_world=1)
        held = sorted(r for _, r, _ in list_shards(directory))
        if rank == 1:
            for _, _, path in list_shards(directory):
                path.unlink()
        return held, resume_part(directory, 0, rank=rank, world=WORLD_SIZE)


def worker(rank: int, init_file: str, out_dir: str) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                                timeout=timedelta(seconds=TIMEOUT_S))
        torch.set_num_threads(1)
        torch.save(run(rank), Path(out_dir) / f"{rank}.pt")
    except BaseException:  # noqa: BLE001 - whatever the rank raised: its peers must not wait for it
        (Path(out_dir) / f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
