"""``gnnpipe`` as the ops tests run it: in this process (fast), as a user's command, and as a foreground job in a
session of its own that the tests signal."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.conftest import GNNPIPE, REPO, cli_env


def cli(*args: str) -> Any:
    """``gnnpipe ARGS`` in this process (fast); stdout in ``.stdout``."""
    result = CliRunner().invoke(app, list(args), env={"ARTIFACTS": None, "GNNPIPE_ORIGIN": None})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def gnnpipe(*args: str) -> subprocess.CompletedProcess:
    """``gnnpipe ARGS`` as a user runs it: ``main`` turns a user error into one ``error:`` line and exit 2."""
    return subprocess.run([*GNNPIPE, *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)


class GnnpipeRun:
    """``gnnpipe run`` in a session of its own (as a shell runs a foreground job), its output collected."""

    def __init__(self, args: list[str], api_url: str | None = None, gnnpipe: list[str] = GNNPIPE) -> None:
        self.proc = subprocess.Popen([*gnnpipe, "run", *args], cwd=REPO, env=cli_env(api_url), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout or []), daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"gnnpipe exited before {text!r}:\n{''.join(self.lines)[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} after {timeout_s} s:\n{''.join(self.lines)[-3000:]}"
            time.sleep(0.1)

    def signal_group(self, sig: int) -> tuple[dict[psutil.Process, str], float]:
        """Signal gnnpipe's process group as a terminal does; returns what ran under gnnpipe then (``name: command
        line``) and the seconds gnnpipe took to exit."""
        tree = {p: f"{p.name()}: {' '.join(p.cmdline()[:6])}"
                for p in psutil.Process(self.proc.pid).children(recursive=True)}
        start = time.monotonic()
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail(f"gnnpipe still running 60 s after {sig!r}:\n{''.join(self.lines)[-3000:]}")
        elapsed = time.monotonic() - start
        self._reader.join(timeout=10)
        return tree, elapsed

    def last_line(self) -> str:
        """The one line printed after the signal: nothing else is, however the stage was stopped."""
        lines = [line.rstrip("\n") for line in self.lines if line.strip()]
        for noise in ("Crash detected", "Error logging to API", "ConnectError", "Traceback", "death signal",
                      "closing signal", "Fatal Python error"):
            assert not any(noise in line for line in lines), "\n".join(lines[-30:])
        assert not lines[-2].startswith("interrupted"), lines[-3:]
        return lines[-1]
