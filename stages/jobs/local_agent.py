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

**Forked ranks.** A rank's imports (torch, torch_geometric, gnnpipe's stages) cost it ~5 CPU-s before it computes:
174 ranks of the CPU suite spent 1 092 CPU-s, ~870 of them importing (benchmarks/RESULTS.md, "Forked ranks"). With
``--fork`` the agent imports the ranks' module once (``python -m module``'s ``sys.path``) and forks each rank from
itself. The child takes its rank's environment (built from the agent's as it was before the import) and Python's
signal handlers, and runs the module's code as ``__main__`` (``runpy``), as ``python -m`` does. It ends with
``os._exit``, without atexit handlers or joining threads, as the workers end anyway (``stages.runtime.rank_process``);
an uncaught exception goes to ``sys.excepthook`` and an uncaught Ctrl-C ends it by SIGINT, as in Python. The ranks
stay the agent's children: watching, stopping and naming them is the same.

What differs from a fresh process: ``ps`` shows the agent's command line (the rank is named ``gnnpipe rank N``),
``/proc/PID/environ`` the agent's environment. The string hash seed is the agent's, which the launcher fixes for
every process of a job (``PYTHONHASHSEED``), so forked and fresh ranks hash alike.

The launcher asks for it only where no GPU driver is visible (``can_fork``): an import may initialise the driver
(PyG's ``typing`` runs a CUDA op at import under pytest where pyg-lib is installed), and a child forked after that
cannot use the GPU. A module that fails to import is said in one line, and each rank starts afresh (``exec``), so its
error reaches the launcher as before. A stop signal during the import ends it at once. Run that way the agent is not
isolated (``-I -S``): it needs the ranks' ``site-packages`` and ``PYTHONPATH``.
"""

from __future__ import annotations

import glob
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from typing import NoReturn, TypeAlias

SCRIPT = os.path.abspath(__file__)
INIT_METHOD_ENV = "GNNPIPE_INIT_METHOD"   # read by stages.runtime.rank_process.init_method
POLL_S = 0.05
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
TAG = "[agent] "
FIRST_FAILURE = ", the first failure"
STOPPED = ", stopped by the agent"


FORK = "--fork"
# a GPU driver's device nodes: NVIDIA's (control, per GPU, UVM), Jetson's, AMD ROCm's kernel driver, WSL's GPU
GPU_DEVICE_NODES = ("/dev/nvidia*", "/dev/nvhost-ctrl", "/dev/kfd", "/dev/dxg")


def can_fork() -> bool:
    """Whether ranks may be forked from an agent that imported their module: no GPU driver is visible here."""
    return not any(glob.glob(node) for node in GPU_DEVICE_NODES)


def _cuda_initialised() -> bool:
    """Whether the import initialised torch's CUDA state (the second guard, should a driver hide from
    ``can_fork``): a child forked after that cannot use the GPU."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def command(rank_argv: list[str], nproc: int, grace_s: float, python: str = sys.executable, *,
            fork: bool = False) -> list[str]:
    """The agent's command line for ``nproc`` ranks of ``rank_argv`` (``[python, "-m", module, ...]``); ``fork``:
    import the module once and fork the ranks from the agent (the module docstring). A module run so does its work
    under ``if __name__ == "__main__":`` only; importing it must do nothing else (the agent imports it)."""
    if fork:
        return [python, SCRIPT, FORK, str(nproc), f"{grace_s:g}", "--", *rank_argv]
    return [python, "-I", "-S", SCRIPT, str(nproc), f"{grace_s:g}", "--", *rank_argv]


def rank_environ(base: dict[str, str], rank: int, nproc: int, store: str) -> dict[str, str]:
    """Rank ``rank``'s environment: torchrun's variables for one node of ``nproc`` ranks, and the file store."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
            INIT_METHOD_ENV: f"file://{store}?rank={rank}&world_size={nproc}"}


class _Signals:
    received: int | None = None   # the first stop signal
    importing = False             # the forking agent imports the ranks' module: a stop signal ends the import


class _StoppedWhileImporting(BaseException):
    pass


def _on_stop_signal(signum: int, frame: object) -> None:
    if _Signals.received is None:
        _Signals.received = signum
    if _Signals.importing:   # no rank exists yet: raising here loses none, and the import can take seconds
        raise _StoppedWhileImporting


def _say(line: str) -> None:
    """One line for the launcher; a reader already gone (the launcher died) must not stop the teardown."""
    try:
        print(f"{TAG}{line}", flush=True)
    except OSError:
        pass


def _stop(ranks: list[RankProcess], grace_s: float) -> set[int]:
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


def _watch(ranks: list[RankProcess]) -> int | None:
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


def _report(ranks: list[RankProcess], first: int, stopped: set[int]) -> None:
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


class _Forked:
    """A rank forked from the agent, with the face of the ``subprocess.Popen`` the agent watches and stops."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int | None:
        return self._reap(0)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:   # not reaped, so the pid is still this rank's (alive or a zombie)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


RankProcess: TypeAlias = "subprocess.Popen[bytes] | _Forked"


def _preload(rank_argv: list[str]) -> str | None:
    """Import the ranks' module (``rank_argv`` is ``[python, "-m", module, ...]``) with ``python -m``'s module path;
    the module, or None where the ranks must start afresh (said in one line). A stop signal during the import
    raises ``_StoppedWhileImporting``."""
    module = rank_argv[2] if len(rank_argv) > 2 and rank_argv[1] == "-m" else None
    if module is None:
        _say(f"cannot fork {rank_argv[:3]} (not 'python -m module'): each rank starts afresh")
        return None
    sys.path[0] = os.getcwd()   # python -m's first entry (this script's directory before)
    try:
        _Signals.importing = True
        if _Signals.received is not None:   # came before the flag was up
            raise _StoppedWhileImporting
        __import__(module)
    except _StoppedWhileImporting:
        raise
    except BaseException as err:   # noqa: BLE001 - any failure: the ranks meet it again and report it as theirs
        _say(f"importing {module} failed ({type(err).__name__}: {err}): each rank starts afresh")
        return None
    finally:
        _Signals.importing = False
    if _cuda_initialised():
        _say(f"importing {module} initialised CUDA, which a forked rank cannot use: each rank starts afresh")
        return None
    # its imports stay; the module itself runs afresh as __main__ in each rank, as under python -m (runpy warns of a
    # module it is asked to run that was imported already)
    sys.modules.pop(module, None)
    return module


def _exit_code(err: SystemExit) -> int:
    """The status Python's own exit gives ``sys.exit(code)`` (a negative one as ``os._exit`` takes it: -1 is 255)."""
    if err.code is None or isinstance(err.code, int):
        return err.code or 0
    print(err.code, file=sys.stderr)
    return 1


def rank_name(rank: int) -> str:
    """A forked rank's process name (``top``, ``ps -o comm``, ``pgrep``): its command line is still the agent's."""
    return f"gnnpipe rank {rank}"[:15]   # Linux keeps 15 bytes of a name


def _name_process(name: str) -> None:
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:   # not Linux: the name is a convenience
        pass


def _end(code: int, died_of: int | None) -> NoReturn:
    """End the forked rank: nothing may interrupt this any more (a signal's exception would unwind into the agent's
    code), the streams flushed, then die of ``died_of`` or exit with ``code``."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed or broken stream must not keep the rank from ending
            pass
    if died_of is not None:
        signal.signal(died_of, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {died_of})
        os.kill(os.getpid(), died_of)
    os._exit(code)


def _run_forked(module: str, argv: list[str], env: dict[str, str], blocked: set[int | signal.Signals]) -> NoReturn:
    """In the forked child: become ``python -m module argv...`` with ``env``, run it, and end the process."""
    code, died_of = 1, None
    try:
        _name_process(rank_name(int(env["RANK"])))
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)   # a signal that came meanwhile is delivered now
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as err:
        code = _exit_code(err)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        died_of = signal.SIGINT   # Python dies of an uncaught Ctrl-C's signal
    except BaseException:   # noqa: BLE001 - the traceback Python prints for an uncaught error, and its status
        sys.excepthook(*sys.exc_info())
    finally:
        _end(code, died_of)


def _fork(module: str, rank_argv: list[str], env: dict[str, str]) -> _Forked:
    """Fork one rank from the agent; the stop signals are held back until the child has its default handlers (one
    that came in between would otherwise run the agent's handler in the child and be lost)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python >= 3.12 warns of forking a process with threads. The module's imports leave idle pools
            # (OpenBLAS's, pyarrow's jemalloc's) whose libraries reset them in the child (pthread_atfork): the
            # children compute (tests/test_local_agent.py), and the warning would repeat in the log per rank.
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:
                _run_forked(module, rank_argv[3:], env, blocked)
            finally:   # never back into the agent's code, whatever happened
                os._exit(1)
    finally:   # the agent's own mask back, also when fork failed (the child never returns here)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return _Forked(pid)


def _start(ranks: list[RankProcess], nproc: int, rank_argv: list[str], store: str, module: str | None,
           environ: dict[str, str]) -> None:
    """Start the ranks one by one (forked from this process if the module was imported here), until all run or a
    stop signal came. ``environ``: the agent's environment before any import."""
    for rank in range(nproc):
        if _Signals.received is not None:
            return
        env = rank_environ(environ, rank, nproc, store)
        ranks.append(_fork(module, rank_argv, env) if module else subprocess.Popen(rank_argv, env=env))


def run(nproc: int, grace_s: float, rank_argv: list[str], fork: bool = False) -> int:
    """Run the job's ranks to the end; the agent's exit status (see the module docstring)."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    environ = dict(os.environ)
    try:   # before the store: a stop during the import leaves nothing to remove
        module = _preload(rank_argv) if fork else None
    except _StoppedWhileImporting:
        module = None
    ranks: list[RankProcess] = []
    store_dir = tempfile.mkdtemp(prefix="gnnpipe-job-")
    code, signum = 1, None
    try:
        _start(ranks, nproc, rank_argv, os.path.join(store_dir, "store"), module, environ)
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
    _fork_ranks = sys.argv[1] == FORK
    _nproc, _grace, _sep, *_argv = sys.argv[1 + _fork_ranks:]
    sys.exit(run(int(_nproc), float(_grace), _argv, _fork_ranks))
