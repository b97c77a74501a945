"""Progress bars for long work that also reach the Prefect log, without flooding it.

``progress`` is a tqdm bar (on the terminal as usual) that additionally logs its line to the Prefect run logger
(or the ``gnnpipe`` logger outside a run) at most every ``log_every_s`` seconds, and once at the end if the work
took long enough to matter.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tqdm.auto import tqdm

LOG_EVERY_S = 30.0
LOG_FINAL_AFTER_S = 5.0


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a flow/task run (tests, benchmarks, workers)
        return logging.getLogger("gnnpipe")


class progress(tqdm):  # noqa: N801 - used like tqdm
    def __init__(self, *args: Any, log_every_s: float = LOG_EVERY_S, **kwargs: Any) -> None:
        kwargs.setdefault("leave", False)
        kwargs.setdefault("mininterval", 0.5)
        self._log_every_s = log_every_s
        self._started = self._last_log = time.monotonic()
        super().__init__(*args, **kwargs)

    def _log(self) -> None:
        self._last_log = time.monotonic()
        run_logger().info("%s", self.format_meter(**self.format_dict).strip())

    def display(self, msg: str | None = None, pos: int | None = None) -> Any:
        shown = super().display(msg, pos)
        if time.monotonic() - self._last_log >= self._log_every_s:
            self._log()
        return shown

    def close(self) -> None:
        if not self.disable and time.monotonic() - self._started >= LOG_FINAL_AFTER_S:
            self._log()
        super().close()


def close_all() -> None:
    """Close every bar still open (each blanks its line: ``leave=False``). A stage that raises inside a bar's loop
    leaves it open for as long as the traceback holds its frame, and the CLI's ``error:`` line must not follow it
    (``flows.terminal``)."""
    for bar in list(tqdm._instances):   # tqdm's registry of live bars, shared by every subclass
        bar.close()
