"""Long-running helpers for deployments: a Prefect server and a process worker, started and stopped by PID.

Each service runs in its own session (process group) with its output in ``$PREFECT_HOME/logs/<name>.log`` and
its PID in ``$PREFECT_HOME/run/<name>.pid``; the server's API URL is in ``run/server.url``, where ``gnnpipe run``
finds it (``flows.api``). Stopping sends SIGTERM to the group, a second SIGTERM after a grace period (a Prefect
worker shuts down gracefully on the first and exits on the second), then SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from storage import GnnpipeError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
POOL = "gnnpipe-local"


def home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", ".prefect")).resolve()


def pid_file(name: str) -> Path:
    return home() / "run" / f"{name}.pid"


def log_file(name: str) -> Path:
    return home() / "logs" / f"{name}.log"


def url_file(name: str) -> Path:
    """The API URL of a running server, so that `gnnpipe run` finds it whatever port it was started on."""
    return home() / "run" / f"{name}.url"


def prefect_exe() -> str:
    exe = Path(sys.executable).with_name("prefect")
    return str(exe) if exe.exists() else (shutil.which("prefect") or "prefect")


def running_pid(name: str) -> int | None:
    """The PID recorded for ``name`` if that process is still alive."""
    path = pid_file(name)
    if not path.exists():
        return None
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (ValueError, ProcessLookupError):
        path.unlink(missing_ok=True)
        return None
    except PermissionError:
        return int(path.read_text().strip())


def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in a new session, recording its PID; refuse if one is already running."""
    if (pid := running_pid(name)) is not None:
        raise GnnpipeError(f"{name} already running (pid {pid}); stop it first with `gnnpipe {name} down`")
    log = log_file(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file(name).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True)
    pid_file(name).write_text(str(proc.pid))
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the service leads its own session: its children get the signal too
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def stop_group(pid: int, grace_s: float = 15.0, *, second_term: bool = True) -> bool:
    """SIGTERM the session led by ``pid``, (a second SIGTERM after ``grace_s``,) then SIGKILL; True once it is gone.

    A Prefect worker shuts down gracefully on the first SIGTERM and exits on the second; uvicorn needs one.
    """
    signals = (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL) if second_term else (signal.SIGTERM, signal.SIGKILL)
    for sig in signals:
        _signal_group(pid, sig)
        deadline = time.monotonic() + (grace_s if sig != signal.SIGKILL else 5.0)
        while time.monotonic() < deadline:
            _reap(pid)
            if not _alive(pid):
                return True
            time.sleep(0.1)
    return False


def stop(name: str, grace_s: float = 15.0) -> bool:
    """Stop ``name`` by PID: SIGTERM, a second SIGTERM after ``grace_s``, then SIGKILL. False if not running."""
    pid = running_pid(name)
    if pid is None:
        return False
    if not stop_group(pid, grace_s):
        raise GnnpipeError(f"{name} (pid {pid}) did not exit after SIGKILL")
    pid_file(name).unlink(missing_ok=True)
    url_file(name).unlink(missing_ok=True)
    return True


def api_url(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    return f"http://{host}:{port}/api"


def wait_healthy(url: str, timeout_s: float = 120.0, pid: int | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if pid is not None and not _alive(pid):
            raise GnnpipeError(f"the Prefect server exited during start-up; see {log_file('server')}")
        time.sleep(0.5)
    raise GnnpipeError(f"no healthy Prefect server at {url} after {timeout_s:.0f} s; see {log_file('server')}")


def server_env(host: str, port: int) -> dict[str, str]:
    """Settings of a server on ``host:port``. The UI is told its API URL by ``/ui-settings``, which Prefect takes
    from PREFECT_UI_API_URL, else from PREFECT_API_URL or the default port: without it a server on 4311 sends the
    browser to http://127.0.0.1:4200/api ("Can't connect to Server API")."""
    env = {"PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(port)}
    if not os.environ.get("PREFECT_UI_API_URL"):   # a user's own (say, behind a proxy) wins
        env["PREFECT_UI_API_URL"] = api_url(host, port)
    return env


def server_up(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout_s: float = 120.0) -> str:
    pid = start("server", [prefect_exe(), "server", "start", "--host", host, "--port", str(port),
                           "--analytics-off"], env=server_env(host, port))
    url = api_url(host, port)
    url_file("server").write_text(url)
    wait_healthy(url, timeout_s, pid)
    return url


def running_server_url() -> str | None:
    """The API URL of the server `gnnpipe server up` started, if it is still running (not checked for health)."""
    if running_pid("server") is None:
        return None
    path = url_file("server")
    # a server started before the URL was recorded: the default port is the best guess
    return path.read_text().strip() if path.exists() else api_url()


def ensure_pool(url: str, pool: str = POOL) -> None:
    """Create the process work pool unless it exists (deployments and workers both need it)."""
    env = {**os.environ, "PREFECT_API_URL": url}
    create = subprocess.run([prefect_exe(), "work-pool", "create", pool, "--type", "process"], env=env,
                            capture_output=True, text=True)
    if create.returncode != 0 and "already exists" not in (create.stdout + create.stderr):
        raise GnnpipeError(f"could not create work pool {pool}: {(create.stderr or create.stdout).strip()[-300:]}")


def worker_up(url: str, pool: str = POOL) -> int:
    """Start a worker polling the (created if needed) process work pool."""
    ensure_pool(url, pool)
    return start("worker", [prefect_exe(), "worker", "start", "--pool", pool, "--type", "process"],
                 env={"PREFECT_API_URL": url})
