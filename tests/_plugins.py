"""Plug-ins the tests name by import path (``tests._plugins:...``: the ranks import them too), and the ranks' side
of the loss-check test (kept free of pytest: spawned ranks import this module)."""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

_calls = 0


def nan_on_rank_1(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy, except NaN at rank 1's third training batch (epoch 1, batch 3)."""
    global _calls
    _calls += 1
    loss = F.cross_entropy(logits, y)
    if dist.is_initialized() and dist.get_rank() == 1 and _calls == 3:
        return loss * float("nan")
    return loss


def per_seed_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Forgets to reduce: one loss per seed."""
    return F.cross_entropy(logits, y, reduction="none")


def not_a_model(**sizes: int) -> str:
    return "a string"


NOT_CALLABLE = 3


def loss_check_worker(rank: int, init_file: str, out_dir: str) -> None:
    """Two ranks check two passes' losses: in the first rank 1's second batch is Inf, in the second rank 0's last is
    NaN (found by ``finish``). Saves, per pass, what each rank raised and how many calls returned before."""
    from stages.train.rank.guard import LossGuard

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        passes = [[1.0, float("inf") if rank == 1 else 0.5, 0.7, 0.6], [1.0, float("nan") if rank == 0 else 0.5]]
        outs = []
        for epoch, losses in enumerate(passes, start=4):
            guard = LossGuard(rank, 2, epoch=epoch)
            out = {"checked": 0, "type": None, "message": None}
            try:
                for b, value in enumerate(losses):
                    guard(b, torch.tensor(value))
                    out["checked"] = b + 1
                guard.finish()
                out["checked"] = "finished"
            except Exception as err:  # noqa: BLE001 - the test reads what each rank raised
                out["type"], out["message"] = type(err).__name__, str(err)
            outs.append(out)
        dist.barrier()   # neither rank is left inside a collective: both got here
        torch.save(outs, Path(out_dir, f"{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - any failure of a rank is written for the parent test to show
        Path(out_dir, f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
