"""A spawned rank's life for ``tests._spawn.spawn_ranks`` (free of pytest: every spawned rank imports it)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def run_gloo_rank(rank: int, init_file: str, out_dir: str, world: int, timeout_s: float,
                  body: Callable[[], Any]) -> None:
    """A spawned rank's life for ``spawn_ranks``: one thread (ranks share the 2-core CI box), a gloo group, then
    ``body()``'s result saved as ``<rank>.pt``; whatever it raises goes to ``<rank>.err`` and a non-zero exit."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        torch.save(body(), Path(out_dir, f"{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - any failure of a rank is written for the parent test to show
        Path(out_dir, f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
