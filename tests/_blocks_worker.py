"""The ranks' side of ``test_blocks``'s distributed GCN test (free of pytest: every spawned rank imports it)."""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.dist_sampler import DistNeighborSampler
from stages.train.models.model import build_model, seed_logits
from stages.train.rank.loader import with_degrees
from stages.train.rank.rank_data import degree_path
from tests._sampler_graphs import BOUNDS, NUM_NODES, power_law_graph, split_csr

WORLD_SIZE = 2
TIMEOUT_S = 90
GCN_SIZES = {"in_channels": 5, "hidden": 8, "out_channels": 3, "num_layers": 2, "dropout": 0.5}


def seeds_of(rank: int) -> list[torch.Tensor]:
    """Per-batch seed gids: own and remote nodes, the hub (gid 3), isolated ones (the last gids), an empty batch."""
    pick = torch.Generator().manual_seed(50 + rank)
    return [torch.randperm(NUM_NODES, generator=pick)[:40], torch.tensor([3, NUM_NODES - 1, 701 - rank]),
            torch.empty(0, dtype=torch.long)]


def worker(rank: int, init_file: str, out_dir: str, weights: dict, x: torch.Tensor) -> None:
    try:
        torch.set_num_threads(1)   # two ranks on a 2-core box
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                                timeout=timedelta(seconds=TIMEOUT_S))
        indptr, indices = split_csr(*power_law_graph(), BOUNDS)[rank]
        csr = LocalCSR.from_numpy(indptr, indices, BOUNDS[rank])
        sampler = DistNeighborSampler(csr, BOUNDS, [-1, -1], generator=torch.Generator().manual_seed(rank))
        degrees = degree_path(csr, BOUNDS, torch.device("cpu"))
        model = build_model("gcn", **GCN_SIZES).eval()
        model.load_state_dict(weights)
        out = []
        with torch.no_grad():
            for seed_gid in seeds_of(rank):
                batch = with_degrees(sampler.sample(seed_gid), degrees)
                out.append((seed_gid, batch.n_id, batch.deg, seed_logits(model, x[batch.n_id], batch)))
        dist.barrier()
        torch.save(out, Path(out_dir, f"{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - any failure of a rank is written for the parent test to show
        Path(out_dir, f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
