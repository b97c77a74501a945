"""SIGINT and SIGTERM end a run the same way: an exception in the main thread, cleanup, one line, exit 128 + signal.

Ctrl-C, ``timeout``, ``docker stop``, systemd and Slurm signal the whole process group; only gnnpipe itself is in
it (the temporary Prefect server and torchrun each run in a session of their own), so the signal becomes an
:class:`Interrupted` here, in the main thread, where Prefect runs the flow and its sync tasks (measured: both run
in MainThread), and unwinds through the stage: the train launcher's ``finally`` stops torchrun's group (the ranks
have written their checkpoint at the end of every epoch), Prefect marks the task and flow run Crashed through the
still running API, and ``flows.api`` stops the server: 2-3 s from the signal to the exit mid-training on a loaded
2-core box. Later signals during that cleanup are ignored, so it is not cut short.

During a flow run Prefect puts its own SIGTERM handler in place (raising ``TerminationSignal`` to mark the run
Crashed), then restores ours and sends the signal again: either way an :class:`Interrupted` reaches the CLI.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType, TracebackType

from flows.config import ORDER

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A run stopped by SIGINT or SIGTERM.

    A BaseException, as KeyboardInterrupt is: ``except Exception`` does not swallow it, ``finally`` blocks run, and
    Prefect marks the task and flow run Crashed. Not a KeyboardInterrupt: typer turns that into a silent exit 130.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        # (stage, who holds its lock) when the run was waiting for another run's build (flows.locks)
        self.waiting_for: tuple[str, str] | None = None
        self.name = signal.Signals(signum).name
        super().__init__(f"{self.name} received")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum   # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class _State:
    handled: int | None = None    # the signal our handler turned into Interrupted
    received = False              # a SIGINT or SIGTERM arrived, whichever handler took it
    wakeup_fd: int | None = None  # read end of the pipe Python writes each handled signal's number to


def received() -> bool:
    """Whether a SIGINT or SIGTERM arrived since :func:`install`, also one Prefect's own handler took."""
    if not _State.received and _State.wakeup_fd is not None:
        try:
            _State.received = bool(set(os.read(_State.wakeup_fd, 64)) & set(_SIGNALS))
        except BlockingIOError:
            pass
    return _State.received


class _AfterSignal(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not received()


def quiet_console_after_signal() -> None:
    """From the signal on, the terminal gets only the CLI's one line: Prefect's "Crash detected!" and Crashed
    states, and torchrun stopping its ranks (~40 lines), still reach the API (the UI), not the console.

    Call it once Prefect has set up its logging. A filter on each console handler, not a flag set by a handler: during
    a flow run Prefect's SIGTERM handler, not ours, takes the signal, and the stage's teardown is logged before ours
    runs; but Python writes every handled signal's number to the wakeup fd the moment it arrives.
    """
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            console = type(handler) is not logging.FileHandler and isinstance(handler, logging.StreamHandler)
            if console and not any(isinstance(f, _AfterSignal) for f in handler.filters):
                handler.addFilter(_AfterSignal())


def _handler(signum: int, frame: FrameType | None) -> None:
    _State.received = True
    if _State.handled is not None:   # cleanup of the first one is under way: let it finish
        return
    _State.handled = signum
    raise Interrupted(signum)


def install() -> None:
    """Handle SIGINT and SIGTERM alike in this (the main) thread; note their arrival in a wakeup fd."""
    if threading.current_thread() is not threading.main_thread():   # Python allows signal handlers only there
        return
    _State.handled, _State.received = None, False
    for sig in _SIGNALS:
        signal.signal(sig, _handler)
    if _State.wakeup_fd is None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)   # the C handler must never block
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        _State.wakeup_fd = read_fd


def interruption(exc: BaseException) -> Interrupted | None:
    """The :class:`Interrupted` that ``exc`` stands for, or None when no signal ended the run.

    Our handler raises wherever the main thread is, and code that calls back into Python from a C extension may
    turn what the callback raised into an error of its own: the CI saw the Interrupted come back as pydantic's
    ``PydanticSerializationError: ... Interrupted: SIGINT received`` (the signal landed while Prefect serialised
    its context) and the terminal got a traceback instead of the one line. Once the handler has raised, any error
    that ends the run is that interruption (chained to it, so that ``interrupted_stage`` still finds the stage).
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, Interrupted):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    if _State.handled is None:
        return None
    stand_in = Interrupted(_State.handled)
    stand_in.__context__ = exc
    return stand_in


def _frames(tb: TracebackType | None) -> list[FrameType]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def interrupted_stage(exc: BaseException) -> str | None:
    """The stage whose code was running when ``exc`` was raised: the outermost frame of a ``stages.<name>``
    module, in ``exc`` or the exceptions it was raised while handling (Prefect's ``TerminationSignal``)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for frame in _frames(cur.__traceback__):
            parts = str(frame.f_globals.get("__name__", "")).split(".")
            if len(parts) >= 2 and parts[0] == "stages" and parts[1] in ORDER:
                return parts[1]
        cur = cur.__context__
    return None


def message(exc: Interrupted, stage: str | None) -> str:
    """The one line a user sees: what was interrupted, what was kept, how to go on."""
    head = f"interrupted by {exc.name}"
    if stage == "train":
        return (f"{head} during stage train: the ranks were stopped and their checkpoints kept; rerun the same "
                f"command to resume training (finished stages are cached)")
    if stage is not None:
        return f"{head} during stage {stage}; rerun the same command to continue (finished stages are cached)"
    if exc.waiting_for is not None:
        waited, holder = exc.waiting_for
        return (f"{head} while waiting for stage {waited}, which another run is building ({holder}); rerun the "
                f"same command to continue (finished stages are cached)")
    return f"{head} (no stage was running); rerun the same command to continue (finished stages are cached)"
