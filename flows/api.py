"""Which Prefect API a run talks to, and the temporary server gnnpipe starts when there is none.

In order: ``PREFECT_API_URL`` if set (it must answer ``/health``); else the server ``gnnpipe server up`` (``make
server-up``) started, found by its PID and URL files in ``$PREFECT_HOME/run``; else a temporary server of our own.

Why not Prefect's own temporary server: it runs in gnnpipe's process group, so Ctrl-C, ``timeout``, ``docker stop``
or Slurm, which signal the whole group, kill it first, and Prefect's shutdown then retries the dead API for 90-120 s.
Ours runs in its own session (the group signal does not reach it), on a free port, under a lifeline supervisor (a
SIGKILLed gnnpipe does not leave it behind, whichever thread started it: stages/jobs/lifeline.py), and is stopped
(SIGTERM to its group, then SIGKILL) when the run ends, however it ends. Its start is overlapped with importing
Prefect in this process (seconds each on a 2-core box: the numbers are in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from flows import interrupts, services
from storage import GnnpipeError

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 120.0   # the server imports ~900 modules: 3 s with bytecode caches, 8-10 s without, on 2 cores
_STOP_GRACE_S = 5.0         # uvicorn stops in ~0.2 s on SIGTERM


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def running_api() -> str | None:
    """The API of a server that is already up: ``PREFECT_API_URL``, or the one ``gnnpipe server up`` started."""
    if url := os.environ.get("PREFECT_API_URL"):
        if not healthy(url):
            raise GnnpipeError(f"PREFECT_API_URL={url} does not answer {url}/health: start that server "
                               f"(`make server-up`) or unset PREFECT_API_URL to let gnnpipe start a temporary one")
        return url
    url = services.running_server_url()
    return url if url is not None and healthy(url) else None


def free_port(host: str = HOST) -> int:
    """A port nobody listens on now (the OS picks it; a race with another process is caught by the health wait)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _server_command(port: int) -> list[str]:
    # what Prefect's own temporary server runs (prefect.server.api.server.SubprocessASGIServer)
    return [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host", HOST,
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]


class TemporaryServer:
    """A Prefect API server for one run, in its own session; ``start`` returns at once, ``wait`` until healthy."""

    def __init__(self, log: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}/api"
        self.log = log or services.log_file("temporary-server")
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> None:
        from stages.jobs.lifeline import supervised  # SIGTERM to the server if gnnpipe dies

        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "ab")  # closed in stop()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_API_PORT": str(self.port)}
        env.pop("PREFECT_API_URL", None)
        cmd, lifeline = supervised(_server_command(self.port), _STOP_GRACE_S)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, pass_fds=lifeline)

    def wait(self, timeout_s: float = STARTUP_TIMEOUT_S) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if healthy(self.url, timeout_s=1.0):
                return self.url
            if self.proc.poll() is not None:
                raise GnnpipeError(f"the temporary Prefect server exited with code {self.proc.returncode} while "
                                   f"starting; its log: {self.log}")
            time.sleep(0.1)
        raise GnnpipeError(f"the temporary Prefect server did not answer {self.url}/health within {timeout_s:.0f} s;"
                           f" its log: {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            services.stop_group(self.proc.pid, _STOP_GRACE_S, second_term=False)
        if self.proc is not None:
            self.proc.wait()
        if self._out is not None:
            self._out.close()


def _drain_prefect(timeout_s: float = 2.0) -> None:
    """Send the logs and events Prefect still holds before the server goes (else, at exit: "Error logging to API"
    and retries). Takes ~0.02 s; bounded, so an interrupted run still exits within seconds."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    try:   # no event loop runs in this thread: both wait on concurrent futures, up to the timeout
        APILogWorker.drain_all(timeout=timeout_s)
        EventsWorker.drain_all(timeout=timeout_s)
    except Exception as err:  # noqa: BLE001 (losing a log line must not hide why the run ended)
        print(f"note: Prefect's last logs were not sent to {os.environ.get('PREFECT_API_URL')}: {err}",
              file=sys.stderr)


@contextmanager
def prefect_api(url: str | None) -> Iterator[str]:
    """Use ``url``, or a temporary server for the duration of the block; exports the URL as PREFECT_API_URL and
    imports Prefect (with that setting) while the server starts."""
    server = TemporaryServer() if url is None else None
    try:
        if server is not None:
            server.start()
            url = server.url
            os.environ["PREFECT_UI_URL"] = ""   # it serves no UI and is gone after the run: no "View at <link>"
        assert url is not None
        os.environ["PREFECT_API_URL"] = url   # read when Prefect's settings load, on its first import
        import flows.pipeline  # noqa: F401  (Prefect imports while the server starts: 1-5 s saved)

        interrupts.quiet_console_after_signal()
        if server is not None:
            server.wait()
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: url}):   # in case Prefect was imported before
            yield url
    finally:
        if server is not None:
            _drain_prefect()
            server.stop()
