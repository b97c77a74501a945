"""Run a function on several spawned ranks for multi-process tests, failing fast and leaving no process behind."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "torch_geometric", "numpy", "scipy.stats"]


def spawn_ranks(target: Any, args: tuple, tmp: Path, world: int, timeout_s: float) -> list[Any]:
    """Run ``target(rank, init_file, out_dir, *args)`` on ``world`` ranks; each writes ``<rank>.pt`` (or
    ``<rank>.err``). A rank that fails stops the run at once instead of leaving its peers blocked in a collective."""
    ctx = mp.get_context("forkserver")
    # the server imports these once and forks each rank from itself: a spawned rank imported them anew (torch and
    # torch_geometric, ~5 CPU-s a rank on this machine), ~40 ranks a suite run; the server has run no parallel
    # region (no OpenMP or CUDA state to inherit), which is what makes forking it safe
    ctx.set_forkserver_preload(PRELOAD)
    procs = [ctx.Process(target=target, args=(r, str(tmp / "init"), str(tmp), *args), daemon=True)
             for r in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
    finally:
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for proc in procs:   # also on failure or timeout: no rank outlives the test
            if proc.is_alive():
                proc.kill()
            proc.join()
    errors = "\n".join(f.read_text() for f in sorted(tmp.glob("*.err")))
    if errors or any(p.exitcode != 0 for p in procs):
        pytest.fail(f"a rank failed (exit codes {[p.exitcode for p in procs]}):\n{errors}")
    if hung:
        pytest.fail(f"ranks {hung} still running after {timeout_s} s: the exchange lost lockstep")
    return [torch.load(tmp / f"{r}.pt", weights_only=False) for r in range(world)]
