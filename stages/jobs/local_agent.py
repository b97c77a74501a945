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
  get SIGTERM, ``grace_s``, then SIGKILL, and every rank that ended non-zero is named in one line each::

      [agent] rank 1 exited with code -9 (pid 4242), the first failure
      [agent] rank 0 exited with code -15 (pid 4241), stopped by the agent

  then the agent exits 1 (as torchrun does). Ranks that fail within one poll are told apart by their error
  records' times (``launcher.failure_message``), not by this order;
- on SIGTERM, SIGINT, SIGHUP or SIGQUIT (a scheduler, ``kill``, Ctrl-C in a terminal) says
  ``[agent] received SIGTERM, stopping the ranks``, stops them the same way and dies of that signal. The handler
  only notes the signal: raising from it could land inside ``Popen`` after the fork, and lose a rank the agent had
  just started (a review saw 3 in 15 such runs leave one behind).

The lines start with ``[agent]`` wherever they land: after a rank's unfinished line (one it died writing) the
launcher still finds them. A rank that outlives a stuck exit is SIGKILLed; the store directory is removed before
the agent exits, whatever ended the job.

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
INIT_METHOD_ENV = "GNNPIPE_INIT_METHOD"   # read by stages.runtime.rank_process.init_method
POLL_S = 0.05
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
TAG = "[agent] "
FIRST_FAILURE = ", the first failure"
STOPPED = ", stopped by the agent"


def command(rank_argv: list[str], nproc: int, grace_s: float, python: str = sys.executable) -> list[str]:
    """The agent's command line for ``nproc`` ranks of ``rank_argv`` (``[python, "-m", module, ...]``)."""
    return [python, "-I", "-S", SCRIPT, str(nproc), f"{grace_s:g}", "--", *rank_argv]


def rank_environ(base: dict[str, str], rank: int, nproc: int, store: str) -> dict[str, str]:
    """Rank ``rank``'s environment: torchrun's variables for one node of ``nproc`` ranks, and the file store."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
            INIT_METHOD_ENV: f"file://{store}?rank={rank}&world_size={nproc}"}


class _Signals:
    received: int | None = None   # the first stop signal


def _on_stop_signal(signum: int, frame: object) -> None:
    if _Signals.received is None:
        _Signals.received = signum


def _say(line: str) -> None:
    """One line for the launcher; a reader already gone (the launcher died) must not stop the teardown."""
    try:
        print(f"{TAG}{line}", flush=True)
    except OSError:
        pass


def _stop(ranks: list[subprocess.Popen[bytes]], grace_s: float) -> set[int]:
    """SIGTERM every live rank, wait up to ``grace_s`` for them, SIGKILL the rest, reap all. The ranks it stopped."""
    stopped = {rank for rank, proc in enumerate(ranks) if proc.poll() is None}
    for rank in stopped:
        ranks[rank].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(proc.poll() is None for proc in ranks) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for proc in ranks:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return stopped


def _watch(ranks: list[subprocess.Popen[bytes]]) -> int | None:
    """Wait until every rank has exited 0 (None), one has failed (its rank), or a stop signal came (-1)."""
    while _Signals.received is None:
        codes = [proc.poll() for proc in ranks]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return failed[0]
        if all(code == 0 for code in codes):
            return None
        time.sleep(POLL_S)
    return -1


def _report(ranks: list[subprocess.Popen[bytes]], first: int, stopped: set[int]) -> None:
    for rank in sorted(range(len(ranks)), key=lambda r: r != first):
        if ranks[rank].returncode:
            why = FIRST_FAILURE if rank == first else STOPPED if rank in stopped else ""
            _say(f"rank {rank} exited with code {ranks[rank].returncode} (pid {ranks[rank].pid}){why}")


def _die_of(signum: int) -> None:
    """End as a process killed by ``signum`` (the stop signals' default action is to terminate; no core file)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _start(ranks: list[subprocess.Popen[bytes]], nproc: int, rank_argv: list[str], store: str) -> None:
    """Start the ranks one by one, until all run or a stop signal came."""
    for rank in range(nproc):
        if _Signals.received is not None:
            return
        ranks.append(subprocess.Popen(rank_argv, env=rank_environ(dict(os.environ), rank, nproc, store)))


def run(nproc: int, grace_s: float, rank_argv: list[str]) -> int:
    """Run the job's ranks to the end; the agent's exit status (see the module docstring)."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    ranks: list[subprocess.Popen[bytes]] = []
    store_dir = tempfile.mkdtemp(prefix="gnnpipe-job-")
    code, signum = 1, None
    try:
        _start(ranks, nproc, rank_argv, os.path.join(store_dir, "store"))
        first = -1 if _Signals.received is not None else _watch(ranks)
        if first is None:
            code = 0
        elif first >= 0:
            _report(ranks, first, _stop(ranks, grace_s))
    finally:   # a stop signal, or anything unforeseen (a rank that could not start): no rank outlives the agent
        signum = _Signals.received if code != 0 else None   # after a finished job a signal stops nothing
        if signum is not None:
            _say(f"received {signal.Signals(signum).name}, stopping the ranks")
        _stop(ranks, grace_s)
        shutil.rmtree(store_dir, ignore_errors=True)
    if signum is not None:
        _die_of(signum)
    return code


if __name__ == "__main__":
    _nproc, _grace, _sep, *_argv = sys.argv[1:]
    sys.exit(run(int(_nproc), float(_grace), _argv))
