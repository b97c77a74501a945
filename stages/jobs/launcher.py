"""Start the ranks under an agent in a subprocess of its own session, stream their logs, and never leave one behind.

The agent is ``local_agent`` on one host (``python -I -S local_agent.py P GRACE -- python -m stages.train.rank.worker
--spec JOB.json``: it starts the P ranks itself, 2.3 s a job sooner than torchrun; with ``--fork`` where no GPU
driver is visible, it imports the worker once and forks the P ranks from itself) and torchrun across hosts
(``python -m torch.distributed.run --nnodes=N ... --rdzv_backend=c10d ...``, whose rendezvous joins them). It runs in
a new session (``start_new_session=True``): the agent and every rank share one process group, so on a timeout, an
interrupt (KeyboardInterrupt, a cancelled Prefect task) or an error the whole group gets SIGTERM, a grace period,
then SIGKILL. The agent notices a dead rank (local: within 50 ms, torchrun: ``--monitor-interval``) and stops the
others; ranks blocked in a collective with a vanished peer also fail by themselves (gloo sees the closed
connection, and every collective has a timeout).

If the launching process itself dies without running any cleanup (SIGKILL, or a SIGTERM while the stage runs
outside the main thread, where Python cannot turn it into an exception), the job's supervisor sees its lifeline
close and stops the group the same way (``lifeline.py``: it depends on the process dying, not on which of its
threads started the job, as Linux's parent-death signal did).

Lines are handed to ``log`` as they come: ranks prefix their own (``[rank r]``), anything else is the agent's
(``[agent]`` or ``[torchrun]``); the agent's failure summary says which rank failed first.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from stages.jobs import local_agent
from stages.jobs.cluster import Cluster
from stages.jobs.errors import TRAINING, JobKind
from stages.jobs.lifeline import supervised
from storage.errors import GnnpipeError, InputError
from storage.train import error_paths, remove_partial_writes, torchrun_log_dir

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 10.0
_RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ")
# torchrun's failure summary: "rank : 1 (local_rank: 1)" then "exitcode : -9 (pid: 123)"
_FAILED_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_PEER_CLOSED = re.compile(r"Connection closed by peer (\S+?)\.? ")   # gloo's words when the other end vanished
# torchrun's own words when its process receives SIGTERM/SIGINT/SIGHUP/SIGQUIT (it then stops its ranks and exits 1):
# "Received 15 death signal, shutting down workers" (torch 2.13; older: "Received Signals.SIGTERM death signal") and
# "SignalException: Process 123 got signal: 15"
_DEATH_SIGNAL = re.compile(r"Received (?:Signals\.)?(\w+) death signal|SignalException: Process \d+ got signal: "
                           r"(?:Signals\.)?(\w+)")
_RANK_ERROR = re.compile(r"^\[rank (\d+)\] error: (.+)$")   # a rank's user error (worker.main prints it)
# local_agent's words: "[agent] rank 1 exited with code -9 (pid 123), the first failure" (or ", stopped by the
# agent"), "[agent] received SIGTERM, stopping the ranks"; searched, not matched: a rank that died mid-line leaves
# its unfinished line in front of them
_AGENT_FAILED = re.compile(re.escape(local_agent.TAG) + r"rank (\d+) exited with code (-?\d+) \(pid \d+\)("
                           + re.escape(local_agent.FIRST_FAILURE) + "|" + re.escape(local_agent.STOPPED) + ")?$")
_AGENT_SIGNAL = re.compile(re.escape(local_agent.TAG) + r"received (SIG\w+), stopping the ranks$")
TORCHRUN, LOCAL_AGENT = "torchrun", "agent"   # how the log and the errors name the agent
AGENT_GRACE = 0.8   # the local agent's grace, as a share of the launcher's


def torchrun_command(spec_path: str, world_size: int, cluster: Cluster | None = None, *,
                     module: str = "stages.train.rank.worker", python: str = sys.executable,
                     log_dir: str | None = None) -> list[str]:
    """This node's torchrun command line for a job of ``world_size`` ranks (single host unless ``cluster``);
    ``log_dir``: the folder of its attempts (``storage.train.torchrun_log_dir``; else a new one in $TMPDIR)."""
    placement = (cluster or Cluster()).torchrun_args(world_size)
    logs = [f"--log-dir={log_dir}"] if log_dir else []
    return [python, "-m", "torch.distributed.run", *placement, "--max-restarts=0", "--monitor-interval=0.5", *logs,
            "-m", module, "--spec", spec_path]


@dataclass(frozen=True)
class JobCommand:
    """This node's command line for a job, and the name of the agent it runs (``TORCHRUN`` or ``LOCAL_AGENT``)."""

    argv: list[str]
    agent: str


def job_command(spec_path: str, world_size: int, cluster: Cluster | None = None, *,
                module: str = "stages.train.rank.worker", python: str = sys.executable,
                grace_s: float = GRACE_S, log_dir: str | None = None) -> JobCommand:
    """``local_agent`` for a single-host job, torchrun for this node's share of a multi-node one (``log_dir``: its
    folder of attempts, ``torchrun_command``)."""
    cluster = cluster or Cluster()
    if cluster.multi_node:
        return JobCommand(torchrun_command(spec_path, world_size, cluster, module=module, python=python,
                                           log_dir=log_dir), TORCHRUN)
    rank_argv = [python, "-m", module, "--spec", spec_path]
    # the agent's own grace ends first: it has reaped its ranks and removed its store before the launcher's SIGKILL
    # of the group (terminate_group, after grace_s) could cut it short
    return JobCommand(local_agent.command(rank_argv, cluster.nproc_per_node(world_size), AGENT_GRACE * grace_s,
                                          python, fork=local_agent.can_fork()), LOCAL_AGENT)


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of the process group ``pgid``."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def terminate_group(pgid: int, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM the whole group, wait up to ``grace_s``, then SIGKILL what is left. Returns the pids killed hard."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return []
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_members(pgid):
            return []
        time.sleep(0.1)
    stubborn = [p.pid for p in _group_members(pgid)]
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return stubborn
    # SIGKILL is delivered asynchronously: return once they are really gone, so callers can rely on it
    psutil.wait_procs([psutil.Process(pid) for pid in stubborn if psutil.pid_exists(pid)], timeout=5)
    return stubborn


@dataclass(frozen=True)
class RankFailure:
    """One entry of the agent's failure summary."""

    rank: int
    exitcode: int | None
    root_cause: bool   # listed under "Root Cause (first observed failure)"


class _Reader(threading.Thread):
    """Reads the job's merged stdout/stderr line by line: logs each line and remembers failure clues."""

    def __init__(self, stream: object, log: Callable[[str], None], agent: str = TORCHRUN, tail: int = 40) -> None:
        super().__init__(name="job-log", daemon=True)
        self.stream, self.log, self.agent = stream, log, agent
        self.tail: deque[str] = deque(maxlen=tail)
        self.failed: list[RankFailure] = []
        self.rendezvous_timeout = False   # torchrun gave up waiting for the other nodes
        self.death_signal: str | None = None   # the signal the agent said it received ("SIGTERM")
        self.said: dict[int, str] = {}         # rank -> its "error: ..." line (when its error file is missing)

    def run(self) -> None:
        pending_rank: int | None = None
        in_root_cause = False
        for raw in self.stream:  # type: ignore[attr-defined]
            line = raw.rstrip("\n")
            self.tail.append(line)
            ranks_line = _RANK_PREFIX.match(line)
            self.log(line if ranks_line or line.startswith(local_agent.TAG) else f"[{self.agent}] {line}")
            if m := _AGENT_FAILED.search(line):
                if m.group(3) != local_agent.STOPPED:   # a rank the agent stopped is a consequence
                    self.failed.append(RankFailure(int(m.group(1)), int(m.group(2)),
                                                   m.group(3) == local_agent.FIRST_FAILURE))
                continue
            if m := _AGENT_SIGNAL.search(line):
                self.death_signal = self.death_signal or m.group(1)
                continue
            if ranks_line:
                if m := _RANK_ERROR.match(line):
                    self.said.setdefault(int(m.group(1)), m.group(2))
                continue
            if "RendezvousTimeoutError" in line:
                self.rendezvous_timeout = True
            if self.death_signal is None and (m := _DEATH_SIGNAL.search(line)):
                self.death_signal = signal_name(m.group(1) or m.group(2))
            if "Root Cause" in line:
                in_root_cause = True
            elif m := _FAILED_RANK.match(line):
                pending_rank = int(m.group(1))
            elif pending_rank is not None and (m := _EXITCODE.match(line)):
                self.failed.append(RankFailure(pending_rank, int(m.group(1)), in_root_cause))
                pending_rank = None


def signal_name(value: str | int) -> str:
    """``"SIGTERM"`` for 15, "15" or "SIGTERM"; the value itself when it names no signal."""
    try:
        return signal.Signals(int(value)).name
    except ValueError:
        text = str(value)
        return text if text.startswith("SIG") or not text.isdigit() else f"signal {text}"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "failed"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def failure_message(failed: Sequence[RankFailure], errors: dict[int, dict[str, object]],
                    returncode: int, death_signal: str | None = None, job: JobKind = TRAINING,
                    agent: str = TORCHRUN) -> GnnpipeError:
    """One line naming the rank that caused the failure.

    A rank that died without writing an error record (a signal, ``os._exit``) is the cause, unless all it got was
    the SIGTERM with which the agent stops the survivors; its peers' errors (lost connections) are consequences.
    The agent's root cause comes first. A signal that the agent itself received (``death_signal``), or died of (a
    negative ``returncode``), came from outside the job: that is the cause, whatever the ranks said afterwards.
    A rank's user error is an ``InputError`` whatever the job; the others are ``job.error``, naming ``job``.
    """
    named = "the job's agent" if agent == LOCAL_AGENT else agent

    def kept(advice: str) -> str:   # the resume advice, for a job that has checkpoints to resume from
        return advice if job.checkpoints else ""

    if death_signal is None and returncode < 0:
        death_signal = signal_name(-returncode)
    if death_signal is not None:
        return job.error(f"{job.name} was stopped by a signal: {named} received {death_signal} from outside "
                         f"gnnpipe (a scheduler, `kill`, the OOM killer) and its ranks were stopped"
                         f"{kept('; the checkpoints were kept: rerun to resume')}")
    ordered = sorted(failed, key=lambda f: (not f.root_cause, f.exitcode == -signal.SIGTERM))
    abrupt = [f for f in ordered if f.rank not in errors]
    if abrupt and (abrupt[0].root_cause or abrupt[0].exitcode != -signal.SIGTERM):
        return job.error(f"{job.name} failed: rank {abrupt[0].rank} {_describe_exit(abrupt[0].exitcode)}; the "
                         f"job was stopped{kept(' (checkpoints kept: rerun to resume)')}")
    user = sorted(rank for rank, rec in errors.items() if rec.get("user_error"))
    if user:
        return InputError(f"rank {user[0]}: {errors[user[0]]['message']}")
    if errors:
        rank = min(errors, key=lambda r: _blame_order(r, errors[r], failed))
        lost = _PEER_CLOSED.search(str(errors[rank]["message"]))
        if lost and agent == LOCAL_AGENT:   # every rank is on this host: the one that died says so above
            return job.error(f"{job.name} failed: rank {rank} lost its connection to {lost.group(1)}: a peer rank "
                             f"died or was stopped first (see the log above)"
                             f"{kept(' (checkpoints kept: rerun to resume)')}")
        if lost:   # this node's ranks are fine: a rank elsewhere (another node) died or was stopped first
            return job.error(f"{job.name} failed: rank {rank} lost its connection to {lost.group(1)}, a rank on "
                             f"another node died or was stopped; that node's log names it"
                             f"{kept(' (checkpoints kept: rerun every node to resume)')}")
        return job.error(f"{job.name} failed: rank {rank} raised {errors[rank]['type']}: "
                         f"{errors[rank]['message']} (see the log above)")
    if abrupt:
        return job.error(f"{job.name} failed: rank {abrupt[0].rank} {_describe_exit(abrupt[0].exitcode)} "
                         f"(see the log above)")
    return job.error(f"{job.name} failed: {named} exited with code {returncode} before naming a rank "
                     f"(see the log above)")


def _blame_order(rank: int, record: dict[str, object], failed: Sequence[RankFailure]) -> tuple[bool, float, bool, int]:
    """Which error record names the cause first: not a lost connection (a consequence), then the earliest written
    (ranks that fail within one poll of the agent are told apart so: ``rank_process.write_error`` stamps the time),
    then the agent's first failure, then the lowest rank."""
    lost = bool(_PEER_CLOSED.search(str(record.get("message", ""))))
    written = record.get("time")
    first = any(f.rank == rank and f.root_cause for f in failed)
    return lost, float(written) if isinstance(written, (int, float)) else float("inf"), not first, rank


def read_errors(result_dir: str | os.PathLike[str]) -> dict[int, dict[str, object]]:
    import json

    errors = {}
    for path in error_paths(result_dir):
        try:
            record = json.loads(path.read_text())
            errors[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue
    return errors


def launch(spec_path: str, world_size: int, *, result_dir: str, log: Callable[[str], None], timeout_s: float,
           env: dict[str, str] | None = None, grace_s: float = GRACE_S, command: list[str] | None = None,
           cluster: Cluster | None = None, job: JobKind = TRAINING,
           module: str = "stages.train.rank.worker") -> None:
    """Run this node's part of the job to completion or raise a one-line :class:`GnnpipeError`; its process group
    is gone either way. ``job`` names the job in the errors (``job.error``, or ``InputError`` for a user's);
    ``module`` is the ranks' program (``python -m module --spec spec_path``).

    ``command`` replaces the agent's command line (tests of the teardown use a torchrun stand-in).
    """
    torchrun_logs = torchrun_log_dir(result_dir)
    chosen = JobCommand(command, TORCHRUN) if command else job_command(spec_path, world_size, cluster,
                                                                         module=module, grace_s=grace_s,
                                                                         log_dir=str(torchrun_logs))
    argv = chosen.argv
    cmd, lifeline = supervised(argv, grace_s)   # stopped even if this process is SIGKILLed
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    # one string hash seed for every rank of the job, forked or started afresh, on every node: a set of names
    # iterates in the same order everywhere (ranks forked from the agent shared its seed, exec'd ones did not, so
    # the CPU tests could not see an order that differs between GPU ranks), and in every run of the job alike. Set
    # whatever the environment says: a seed inherited on one node only would split the ranks again
    child_env["PYTHONHASHSEED"] = "0"
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), child_env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            errors="replace", cwd=str(REPO), env=child_env, start_new_session=True,
                            pass_fds=lifeline)
    log(f"[launcher] pid {proc.pid} (process group {proc.pid}): {shlex.join(argv)}")
    reader = _Reader(proc.stdout, log, chosen.agent)
    reader.start()
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        # always, also after success: no rank outlives the job (KeyboardInterrupt and cancellation land here too)
        stubborn = terminate_group(proc.pid, grace_s)
        proc.wait()
        reader.join(timeout=5)
        remove_partial_writes(result_dir)   # every rank is gone: a record half-written by a killed one is litter
        shutil.rmtree(torchrun_logs, ignore_errors=True)   # torchrun's empty attempt folders (no --redirects)
    if stubborn:
        log(f"[launcher] SIGKILLed pids {stubborn} that ignored SIGTERM for {grace_s:.0f} s")
    if timed_out:
        raise job.error(f"{job.name} timed out after {timeout_s:g} s and was stopped"
                        f"{job.timeout_advice.format(timeout_s=timeout_s)}")
    if proc.returncode != 0 and reader.rendezvous_timeout and cluster is not None and cluster.multi_node:
        raise job.error(f"the other nodes did not join the rendezvous at {cluster.rdzv_endpoint} (id "
                        f"{cluster.rdzv_id}) within {cluster.join_timeout_s:g} s: start `gnnpipe train` on all "
                        f"{cluster.nnodes} nodes with the same --rdzv, and open that port between them")
    if proc.returncode != 0:
        errors = read_errors(result_dir)
        for rank, message in reader.said.items():   # its error file could not be written (e.g. a full disk)
            errors.setdefault(rank, {"rank": rank, "type": "GnnpipeError", "user_error": True, "message": message})
        raise failure_message(reader.failed, errors, proc.returncode, reader.death_signal, job, chosen.agent)
