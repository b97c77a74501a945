"""A rank program for ``tests/test_local_agent.py``: ``python -m tests._agent_rank --spec SPEC.json``, started by
the launcher's single-host agent. The spec's ``mode`` says what the rank does (see the test module)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from stages.runtime.rank_process import init_method, rank_env, run_rank

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                 "GNNPIPE_INIT_METHOD")


def _join_and_sum(rank: int) -> float:
    """Join the group through the agent's file store, as the train and infer workers do, and sum the ranks."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method(), timeout=timedelta(seconds=60))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    dist.barrier()
    return float(total.item())


def _raise_or_wait(rank: int) -> None:
    _join_and_sum(rank)
    if rank == 1:
        raise RuntimeError("boom")
    import torch.distributed as dist

    dist.barrier()   # rank 1 never comes: gloo reports the closed connection


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    spec = json.loads(Path(parser.parse_args().spec).read_text())
    env, out = rank_env(), Path(spec["result_dir"])
    # one write: unbuffered, print() writes the text and its newline apart, and the peers' lines slip in between
    sys.stdout.write(f"[rank {env.rank}] pid {os.getpid()} ready\n")
    sys.stdout.flush()
    mode = spec["mode"]
    if mode == "raise":   # rank 1 raises; rank 0, waiting in a collective, loses its connection a moment later
        return run_rank(parser.parse_args().spec, env, lambda: _raise_or_wait(env.rank), refused=lambda err: None)
    if mode == "env":
        record: dict[str, object] = {name: os.environ.get(name) for name in TORCHRUN_VARS}
        record["sum"] = _join_and_sum(env.rank)
        record["cmdline"] = Path("/proc/self/cmdline").read_bytes().decode().split("\0")
        record["comm"] = Path("/proc/self/comm").read_text().strip()
        record["argv0"], record["main"] = sys.argv[0], __name__
        record["hash"] = hash("gnnpipe")   # the string hash seed's
        record["sigint_raises"] = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        record["sigterm"] = str(signal.getsignal(signal.SIGTERM))
        (out / f"env-{env.rank}.json").write_text(json.dumps(record))
        return 0
    if mode == "stubborn" and env.rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a rank stuck in native code: only SIGKILL ends it
    if env.rank == 1 and mode == "exit":
        sys.exit(spec["code"])
    if env.rank == 1 and mode == "interrupt":
        raise KeyboardInterrupt   # uncaught: Python ends the process by SIGINT
    if env.rank == 1 and mode in ("die", "stubborn"):
        while not (out / "rank0-waiting").exists():   # its peer is in its (collective-like) wait
            time.sleep(0.02)
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)   # the OOM killer's way
        return 3
    if env.rank == 0:
        (out / "rank0-waiting").touch()
    time.sleep(600)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # as the train and infer workers end: the interpreter's teardown of a gloo group can abort the process (seen
    # once in CI, rank 1 of the env test killed by SIGABRT after its record was written)
    os._exit(code)
