"""What starting a job's ranks costs before they compute: torchrun (the launcher's way across hosts), gnnpipe's
single-host agent (``stages.jobs.local_agent``, the launcher's way on one host) starting each rank afresh
(``agent_exec``, on GPU hosts) or forking them after importing their module once (``agent_fork``, where no GPU
driver is visible), and the same ranks started directly with the env vars torchrun would give them (issue [3/5]: the
suite's time).

Each job is ``--ranks`` processes of ``python -m <rank module>``: it imports what a train rank imports
(``stages.train.rank.worker``: torch, torch_geometric, the stages), joins a gloo group, passes one barrier and
leaves: the floor every train and infer job pays. Wall and CPU seconds (children's user + system) per job, median of
``--rounds``, the ways taking turns. Prints one JSON line::

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # the repository, for stages.jobs

RANK_MODULE = "gnnpipe_bench_rank"
RANK = """
import os
import stages.train.rank.worker   # a train rank's imports
import torch.distributed as dist
if __name__ == "__main__":   # importing it does nothing more: the forking agent imports it before it forks
    dist.init_process_group("gloo", init_method=os.environ.get("GNNPIPE_INIT_METHOD"))   # the agent's store, or env://
    dist.barrier(); dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


RANK_ARGV = [sys.executable, "-m", RANK_MODULE]


def torchrun_job(ranks: int) -> None:
    with tempfile.TemporaryDirectory() as logs:   # torchrun's default, a new $TMPDIR/torchelastic_*, stays behind
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                        "--max-restarts=0", f"--log-dir={logs}", "-m", RANK_MODULE], check=True, capture_output=True)


def _agent_job(ranks: int, fork: bool) -> None:
    from stages.jobs import local_agent

    subprocess.run(local_agent.command(RANK_ARGV, ranks, 10.0, fork=fork), check=True, capture_output=True)


def agent_exec_job(ranks: int) -> None:
    _agent_job(ranks, fork=False)


def agent_fork_job(ranks: int) -> None:
    _agent_job(ranks, fork=True)


def direct_job(ranks: int) -> None:
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(ranks))
    procs = [subprocess.Popen(RANK_ARGV, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(ranks)]
    if any(p.wait() for p in procs):
        raise SystemExit("a directly started rank failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from stages.jobs import local_agent

    ways = {"torchrun": torchrun_job, "agent_exec": agent_exec_job, "agent_fork": agent_fork_job,
            "direct": direct_job}
    if not local_agent.can_fork():   # a GPU host: the launcher never forks here, so neither does the benchmark
        del ways["agent_fork"]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, f"{RANK_MODULE}.py").write_text(RANK)
        os.environ["PYTHONPATH"] = os.pathsep.join([tmp, str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        for _ in range(args.rounds):
            for name, job in ways.items():
                wall, cpu = time.perf_counter(), _children_cpu_s()
                job(args.ranks)
                times[name].append((time.perf_counter() - wall, _children_cpu_s() - cpu))
    result: dict[str, object] = {"ranks": args.ranks, "rounds": args.rounds, "load_avg": os.getloadavg()[0]}
    for name, runs in times.items():
        result[name] = {"wall_s": round(statistics.median(w for w, _ in runs), 2),
                        "cpu_s": round(statistics.median(c for _, c in runs), 2)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
