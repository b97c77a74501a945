"""The single-host agent: start a job's ranks directly, watch them, and stop them all when one fails or a stop signal
comes. Multi-node jobs keep torchrun (its c10d rendezvous is what joins the hosts).

torchrun's elastic agent costs a 2-rank job ~2.3 s of wall time and 2.5 CPU-s before a rank computes (it imports
torch and runs a rendezvous even with ``--standalone``: benchmarks/RESULTS.md, "[3/5] The suite's time"). One host
needs none of it. This program is standard library only, run by path with ``python -I -S`` (like ``lifeline``), and:

- gives rank r torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK``, ``ROLE_RANK``, ...), and instead of ``MASTER_PORT`` a file store in a private temporary directory
  (``GNNPIPE_INIT_METHOD=file://DIR/store?rank=r&world_size=P``, read by ``rank_process.init_method``): no free
  port to pick, so none to lose to another process between picking it and binding it;
- starts the ranks in its own process group (the launcher's session), so the launcher's group teardown reaches them;
- polls them every 50 ms (torchrun's monitor: 500 ms as the launcher runs it). When one exits non-zero, the others
  get SIGTERM, ``grace_s``, then SIGKILL, and every rank that failed is named in one line each::

      rank 1 exited with code -9 (pid 4242), the first failure
      rank 0 exited with code -15 (pid 4241)

  then the agent exits 1 (as torchrun does);
- on SIGTERM, SIGINT, SIGHUP or SIGQUIT (a scheduler, ``kill``, Ctrl-C in a terminal) says
  ``received SIGTERM, stopping the ranks``, stops them the same way and dies of that signal.

``stages.jobs.launcher`` reads these lines as it reads torchrun's failure summary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SCRIPT = os.path.abspath(__file__)
INIT_METHOD_ENV = "GNNPIPE_INIT_METHOD"   # also in stages.runtime.rank_process (this file imports nothing of ours)
POLL_S = 0.05
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
FIRST_FAILURE = ", the first failure"


def command(rank_argv: list[str], nproc: int, grace_s: float, python: str = sys.executable) -> list[str]:
    """The agent's command line for ``nproc`` ranks of ``rank_argv`` (``[python, "-m", module, ...]``)."""
    return [python, "-I", "-S", SCRIPT, str(nproc), f"{grace_s:g}", "--", *rank_argv]


def rank_environ(base: dict[str, str], rank: int, nproc: int, store: str) -> dict[str, str]:
    """Rank ``rank``'s environment: torchrun's variables for one node of ``nproc`` ranks, and the file store."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
            INIT_METHOD_ENV: f"file://{store}?rank={rank}&world_size={nproc}"}


class _StopSignal(BaseException):   # noqa: N818 - a signal, not an error
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_stop_signal(signum: int, frame: object) -> None:
    for sig in _STOP_SIGNALS:   # one is enough: the group's SIGTERM may be followed by more while we stop
        signal.signal(sig, signal.SIG_IGN)
    raise _StopSignal(signum)


def _stop(ranks: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every live rank, wait up to ``grace_s`` for them, SIGKILL the rest, reap all."""
    for proc in ranks:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(proc.poll() is None for proc in ranks) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for proc in ranks:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _watch(ranks: list[subprocess.Popen[bytes]]) -> int | None:
    """Wait until every rank has exited 0 (None) or one has failed (its rank)."""
    while True:
        codes = [proc.poll() for proc in ranks]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return failed[0]
        if all(code == 0 for code in codes):
            return None
        time.sleep(POLL_S)


def _report(ranks: list[subprocess.Popen[bytes]], first: int) -> None:
    for rank in sorted(range(len(ranks)), key=lambda r: r != first):
        if ranks[rank].returncode:
            print(f"rank {rank} exited with code {ranks[rank].returncode} (pid {ranks[rank].pid})"
                  f"{FIRST_FAILURE if rank == first else ''}", flush=True)


def _die_of(signum: int) -> None:
    """End as a process killed by ``signum`` (the stop signals' default action is to terminate; no core file)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def run(nproc: int, grace_s: float, rank_argv: list[str]) -> int:
    """Run the job's ranks to the end; the agent's exit status (see the module docstring)."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    ranks: list[subprocess.Popen[bytes]] = []
    store_dir = tempfile.mkdtemp(prefix="gnnpipe-job-")
    try:
        for rank in range(nproc):
            env = rank_environ(dict(os.environ), rank, nproc, os.path.join(store_dir, "store"))
            ranks.append(subprocess.Popen(rank_argv, env=env))
        first = _watch(ranks)
        if first is None:
            return 0
        _stop(ranks, grace_s)
        _report(ranks, first)
        return 1
    except _StopSignal as stop:
        print(f"received {signal.Signals(stop.signum).name}, stopping the ranks", flush=True)
        _stop(ranks, grace_s)
        shutil.rmtree(store_dir, ignore_errors=True)
        _die_of(stop.signum)
        return 128 + stop.signum
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


if __name__ == "__main__":
    _nproc, _grace, _sep, *_argv = sys.argv[1:]
    sys.exit(run(int(_nproc), float(_grace), _argv))
