"""The 2-rank half of tests/test_link_metrics.py: each rank holds half the positives and negatives."""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from stages.train.tasks.link_metrics import RankSums, global_kth_negative, hits_at_k

WORLD_SIZE = 2
K = 20


def scores(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positives [300], their own negatives [300, 50] and shared negatives [400], with ties (scores in tenths)."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 30, (300,), generator=gen).float() / 10
    neg = torch.randint(0, 30, (300, 50), generator=gen).float() / 10
    shared = torch.randn(400, generator=gen)
    return pos, neg, shared


def worker(rank: int, init_file: str, out_dir: str) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                                timeout=timedelta(seconds=60))
        pos, neg, shared = scores()
        mine = slice(rank * 150, (rank + 1) * 150)
        sums = RankSums.of(pos[mine], neg[mine]).all_reduce()
        kth = global_kth_negative(shared[rank * 200:(rank + 1) * 200], K)
        few = global_kth_negative(shared[:5] if rank == 0 else shared[:0], K)   # 5 negatives in all
        torch.save({"sums": sums, "kth": kth, "hits": hits_at_k(pos[mine], kth), "few": few},
                   Path(out_dir) / f"{rank}.pt")
    except BaseException:  # noqa: BLE001 - whatever the rank raised: its peer must not wait for it
        (Path(out_dir) / f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
