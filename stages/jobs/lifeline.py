"""Start a job that is stopped when this *process* dies, however it dies and whichever of its threads started it.

Linux's parent-death signal (``PR_SET_PDEATHSIG``) cannot give that: it fires when the *thread* that forked exits,
so a job started from a short-lived thread was SIGTERMed while gnnpipe lived on. A pipe can: every process that
starts a supervised job holds the write end of one pipe (close-on-exec, so no other program inherits it, and closed
in fork children that do not exec), and the kernel closes it only when the whole process is gone, SIGKILL included.

The job runs under a small supervisor (this file, run by path with ``python -I -S``: standard library only; 34 ms
to start and end ``/bin/true`` on 2 busy cores, 9 ms more than the prctl exec wrapper it replaces, against seconds
for torchrun) that gets the read end (``pass_fds``), starts the job as its child in its process group (the one
``start_new_session`` made), and waits for either:

- the job to end: the supervisor exits with the job's status exactly (the same code, or dies of the same signal),
  so a caller reads ``returncode`` as if it had started the job itself;
- end-of-file on the lifeline (the launching process is gone): SIGTERM to the group, up to ``grace_s`` for the job
  to stop (torchrun stops its ranks on SIGTERM), then SIGKILL to the group, the supervisor included.

The supervisor outlives the group's SIGTERM/SIGINT/SIGHUP/SIGQUIT (no-op handlers, which exec resets, so the job
still gets the default actions) and waits for the job: stop the job by signalling its group, as
``launcher.terminate_group`` does. If the launcher is already gone when the supervisor starts, the job never starts.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from typing import NamedTuple, NoReturn

SCRIPT = os.path.abspath(__file__)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)   # torchrun's "death signals"
_POLL_MS = 200   # how often the job is polled where pidfd_open is missing (Linux < 5.3, other Unixes)

_lock = threading.Lock()
_pipe: tuple[int, int] | None = None   # (read end, write end) of this process's lifeline; never written to


def _lifeline() -> int:
    """The read end of this process's lifeline, created on first use (``os.pipe`` fds are close-on-exec)."""
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = os.pipe()
        return _pipe[0]


def _after_fork_in_child() -> None:
    # A fork that does not exec (multiprocessing's "fork") would hold the write end and keep every job alive after
    # this process died: the child drops it and makes its own lifeline if it starts jobs. (The read end stays open:
    # a preexec_fn fork runs this hook too, before the read end is handed to the supervisor.)
    global _pipe, _lock
    _lock = threading.Lock()   # another thread may have held it at the fork
    if _pipe is not None:
        os.close(_pipe[1])
        _pipe = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Supervised(NamedTuple):
    """What to hand ``subprocess.Popen``: ``Popen(s.args, pass_fds=s.pass_fds, start_new_session=True, ...)``."""

    args: list[str]
    pass_fds: tuple[int, ...]


def supervised(cmd: list[str], grace_s: float) -> Supervised:
    """``cmd`` under a supervisor that stops it (SIGTERM, ``grace_s``, SIGKILL) when this process dies.

    Start it in a new session (``start_new_session=True``): the supervisor signals its own process group, and only
    when it leads one (else it signals the job alone). Not on Windows: ``cmd`` unchanged.
    """
    if os.name != "posix":
        return Supervised(list(cmd), ())
    fd = _lifeline()
    return Supervised([sys.executable, "-I", "-S", SCRIPT, str(fd), f"{grace_s:g}", "--", *cmd], (fd,))


# ---- the supervisor (this file run as a program) ----

def _gone(fd: int, events: int) -> bool:
    """Whether the lifeline says the launcher is gone: end-of-file (nobody writes; a stray byte is dropped)."""
    return bool(events & (select.POLLHUP | select.POLLERR)) or (bool(events & select.POLLIN) and not os.read(fd, 1))


def _signal_all(job: subprocess.Popen[bytes], sig: int) -> None:
    try:
        if os.getpgid(0) == os.getpid():   # we lead the group: the job's children go too
            os.killpg(0, sig)
        else:                              # started without a new session: the caller's group is not ours to signal
            job.send_signal(sig)
    except ProcessLookupError:
        pass


def _stop(job: subprocess.Popen[bytes], grace_s: float) -> NoReturn:
    """The launcher died: stop the job as ``terminate_group`` would have, then go with it."""
    _signal_all(job, signal.SIGTERM)
    try:
        job.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_all(job, signal.SIGKILL)   # the stragglers; as group leader, the supervisor too
    job.wait()
    _exit_like(job.returncode)


def _exit_like(returncode: int) -> NoReturn:
    """Exit with ``returncode`` as Popen reports it: a negative one is a signal, which we die of in turn."""
    if returncode < 0:
        import resource

        sig = -returncode
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no 2nd core
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        returncode = 128 + sig   # a signal whose default is to ignore it (the job cannot have died of one)
    sys.exit(returncode)


def _supervise(fd: int, grace_s: float, cmd: list[str]) -> NoReturn:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if any(_gone(fd, ev) for _, ev in poller.poll(0)):
        print(f"lifeline: the launching process is gone; {cmd[0]} not started", file=sys.stderr)
        sys.exit(1)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: None)
    try:
        job = subprocess.Popen(cmd)   # close_fds (the default): the job does not hold the lifeline
    except OSError as err:
        print(f"lifeline: cannot start {cmd[0]}: {err}", file=sys.stderr)
        sys.exit(127)
    try:
        poller.register(os.pidfd_open(job.pid), select.POLLIN)   # readable when the job exits
        timeout_ms: int | None = None
    except (AttributeError, OSError):
        timeout_ms = _POLL_MS
    while job.poll() is None:
        if any(_gone(fd, ev) for ready, ev in poller.poll(timeout_ms) if ready == fd):
            _stop(job, grace_s)
    _exit_like(job.returncode)


if __name__ == "__main__":
    _fd, _grace, _sep, *_cmd = sys.argv[1:]
    _supervise(int(_fd), float(_grace), _cmd)
