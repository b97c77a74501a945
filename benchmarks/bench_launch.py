"""What starting a job's ranks costs before they compute: torchrun (the launcher's way across hosts), gnnpipe's
single-host agent (``stages.jobs.local_agent``, the launcher's way on one host) and the same ranks started directly
with the env vars torchrun would give them, the floor (issue [3/5]: the suite's time).

Each job is ``--ranks`` processes that import torch, join a gloo group, pass one barrier and leave: the floor every
train and infer job pays. Wall and CPU seconds (children's user + system) per job, median of ``--rounds``,
alternating the two ways. Prints one JSON line::

    python benchmarks/bench_launch.py --ranks 2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository, for stages.jobs

RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=os.environ.get("GNNPIPE_INIT_METHOD"))   # the agent's file store, else env://
dist.barrier(); dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def torchrun_job(script: str, ranks: int) -> None:
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                    "--max-restarts=0", script], check=True, capture_output=True)


def agent_job(script: str, ranks: int) -> None:
    from stages.jobs import local_agent

    subprocess.run(local_agent.command([sys.executable, script], ranks, 10.0), check=True, capture_output=True)


def direct_job(script: str, ranks: int) -> None:
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(ranks))
    procs = [subprocess.Popen([sys.executable, script], env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(ranks)]
    if any(p.wait() for p in procs):
        raise SystemExit("a directly started rank failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ways = {"torchrun": torchrun_job, "agent": agent_job, "direct": direct_job}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp:
        script = str(Path(tmp, "rank.py"))
        Path(script).write_text(RANK)
        for _ in range(args.rounds):
            for name, job in ways.items():
                wall, cpu = time.perf_counter(), _children_cpu_s()
                job(script, args.ranks)
                times[name].append((time.perf_counter() - wall, _children_cpu_s() - cpu))
    result: dict[str, object] = {"ranks": args.ranks, "rounds": args.rounds, "load_avg": os.getloadavg()[0]}
    for name, runs in times.items():
        result[name] = {"wall_s": round(statistics.median(w for w, _ in runs), 2),
                        "cpu_s": round(statistics.median(c for _, c in runs), 2)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
