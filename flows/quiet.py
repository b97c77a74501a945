"""One line for a user's error: keep Prefect's repeats of it, tracebacks included, off the terminal.

A stage that raises a :class:`~storage.GnnpipeError` (bad input files, a full disk, a failed rank) is logged by
Prefect three or four times before ``gnnpipe`` prints its one ``error:`` line: the task run's exception with its
traceback, the task's "Finished in state Failed(...)", the flow run's exception with a second traceback, and the
flow's final state (116 lines for a ``y.npy`` of the wrong length, 2 tracebacks). The stage tasks note each such
error (:func:`note_user_error`); the filter installed on Prefect's console handlers then sends every record that
carries or repeats a noted error to ``$PREFECT_HOME/logs/errors.log`` instead of the terminal. Prefect's API
handler is untouched: the flow run's page in the UI keeps the whole record. Errors that are not the user's (a bug,
an ``OSError`` nobody turned into a message) keep their tracebacks on the terminal.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from prefect.logging.handlers import PrefectConsoleHandler

from flows import services
from storage import GnnpipeError

_noted: set[str] = set()
_lock = threading.Lock()


def note_user_error(err: GnnpipeError) -> None:
    """Mark ``err``'s message as reported: the CLI prints it once, Prefect's repeats go to the log file."""
    with _lock:
        _noted.add(str(err))


def error_log() -> Path:
    return services.home() / "logs" / "errors.log"


def _is_user_error(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:   # the GnnpipeError may be the cause of what Prefect re-raised
        if isinstance(exc, GnnpipeError):
            return True
        exc = exc.__cause__ or exc.__context__
    if not _noted:
        return False
    message = record.getMessage()
    with _lock:
        return any(noted in message for noted in _noted)


class UserErrorFilter(logging.Filter):
    """Drops records of a noted user error from the handler it is on, appending them to :func:`error_log`."""

    _format = logging.Formatter("%(asctime)s %(levelname)s %(name)s - %(message)s")

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_user_error(record):
            return True
        try:
            path = error_log()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(self._format.format(record) + "\n")
        except OSError:   # a full disk must not turn the one error line into a logging traceback
            pass
        return False


def install() -> None:
    """Put the filter on every Prefect console handler (idempotent); call after ``prefect`` is imported."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler) and not any(
                    isinstance(f, UserErrorFilter) for f in handler.filters):
                handler.addFilter(UserErrorFilter())
