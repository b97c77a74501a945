"""Which Prefect API a run uses, and the UI of a server on a non-default port.

What broke (issue 12):
- item 4: a run where every stage was cached took 48 s, most of it starting Prefect's temporary server. Now, when
  no server is running, such a run skips Prefect: it prints every stage as Cached and starts no server.
- item 8: ``PREFECT_PORT=4311 make server-up`` served a UI whose ``/ui-settings`` said ``api_url
  http://127.0.0.1:4200/api``: every page showed "Can't connect to Server API".
And a run finds the server ``gnnpipe server up`` started (on whatever port) and records its flow run there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._train_pipeline import build_without_prefect
from tests.conftest import GNNPIPE, REPO, TINY, cli_env

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium")
IN_CI = os.environ.get("CI") == "true"   # .ci/run sets it and installs chromium: there the UI test must run
NO_API = "Can't connect to Server API"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A tiny pipeline up to train, every stage built (without Prefect); returns the `gnnpipe run` arguments that
    match it (infer, which nothing here reads, is left out: ~5 s)."""
    values = {**TINY, "fanouts": [5, 5], "batch_size": 64, "hidden": 16, "epochs": 2, "lr": 0.02,
              "threads_per_rank": 1, "until": "train"}
    root = tmp_path_factory.mktemp("ops-server") / "art"
    build_without_prefect({**values, "artifacts": str(root)})
    return [*(a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")), "--artifacts", str(root)]


def gnnpipe(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GNNPIPE, *args], cwd=REPO, env={**cli_env(), "PREFECT_HOME": str(home), **env},
                          capture_output=True, text=True, timeout=300)


def stage_states(stdout: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^(download|partition|features|hotness|train) +(\w+) ", stdout, re.M)}


def test_fully_cached_run_starts_no_server(built: list[str], tmp_path: Path):
    proc = gnnpipe(["run", *built], tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    assert stage_states(proc.stdout) == dict.fromkeys(("download", "partition", "features", "hotness", "train"),
                                                      "Cached")
    assert "## train `" in proc.stdout   # the reports follow, as after a flow run
    assert "no Prefect flow run was recorded" in proc.stderr
    assert not (tmp_path / "home" / "logs" / "temporary-server.log").exists(), "a temporary server was started"


def test_unreachable_prefect_api_url_is_one_error_line(built: list[str], tmp_path: Path):
    port = free_port()   # nothing listens there
    proc = gnnpipe(["run", *built], tmp_path / "home", PREFECT_API_URL=f"http://127.0.0.1:{port}/api")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: PREFECT_API_URL=http://127.0.0.1:{port}/api does not answer http://127.0.0.1:{port}/api/health: "
        f"start that server (`make server-up`) or unset PREFECT_API_URL to let gnnpipe start a temporary one"]


def api_post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """`gnnpipe server up` on a free, non-default port with its own PREFECT_HOME; stopped by PID at the end."""
    home, port = tmp_path_factory.mktemp("prefect-home"), free_port()
    try:
        up = gnnpipe(["server", "up", "--port", str(port)], home)
        assert up.returncode == 0, up.stdout + up.stderr
        yield home, port
    finally:
        gnnpipe(["server", "down"], home)
        assert not (home / "run" / "server.pid").exists(), "server left running"


def test_ui_is_told_the_api_on_its_own_port(server: tuple[Path, int]):
    _, port = server
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui-settings", timeout=30) as resp:
        assert json.load(resp)["api_url"] == f"http://127.0.0.1:{port}/api"


@pytest.fixture(scope="module")
def recorded_run(server: tuple[Path, int], built: list[str]) -> dict[str, Any]:
    """`gnnpipe run` with that server up (no PREFECT_API_URL): the flow run it recorded there."""
    home, port = server
    proc = gnnpipe(["run", *built], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(stage_states(proc.stdout)) == {"download", "partition", "features", "hotness", "train"}
    assert "no Prefect flow run was recorded" not in proc.stderr
    assert not (home / "logs" / "temporary-server.log").exists(), "a temporary server was started"
    [flow_run] = api_post(f"http://127.0.0.1:{port}/api", "/flow_runs/filter",
                          {"sort": "EXPECTED_START_TIME_DESC", "limit": 1})
    return flow_run


def test_run_records_its_flow_run_in_the_running_server(recorded_run: dict[str, Any]):
    assert recorded_run["state"]["name"] == "Completed"


def page_text(url: str, out: Path) -> str:
    """The text of ``url`` once the UI has rendered (a headless Chromium); a screenshot of it lands in ``out``."""
    assert CHROMIUM is not None
    flags = [CHROMIUM, "--headless", "--disable-gpu", f"--user-data-dir={out.parent / 'chromium-profile'}",
             "--virtual-time-budget=15000", "--window-size=1400,1000"]
    if os.geteuid() == 0:
        flags.append("--no-sandbox")   # Chromium refuses to run as root with its sandbox
    subprocess.run([*flags, f"--screenshot={out}", url], capture_output=True, timeout=180, check=True)
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom.stdout))


@pytest.mark.skipif(CHROMIUM is None and not IN_CI,
                    reason="no `chromium` on PATH to render the UI (Debian: apt-get install chromium)")
def test_ui_pages_show_the_run_and_the_train_report(server: tuple[Path, int], recorded_run: dict[str, Any],
                                                    tmp_path: Path):
    assert CHROMIUM is not None, "CI=true but no `chromium` on PATH: .ci/run installs it (apt-get, as root)"
    _, port = server
    base = f"http://127.0.0.1:{port}"
    run_page = page_text(f"{base}/runs/flow-run/{recorded_run['id']}", tmp_path / "flow-run.png")
    assert NO_API not in run_page and recorded_run["name"] in run_page, run_page[:2000]
    [report] = api_post(f"{base}/api", "/artifacts/filter",
                        {"artifacts": {"key": {"any_": ["gnnpipe-train-report"]}}, "limit": 1})
    report_page = page_text(f"{base}/artifacts/artifact/{report['id']}", tmp_path / "train-report.png")
    assert NO_API not in report_page and "test accuracy" in report_page, report_page[:2000]
    assert (tmp_path / "flow-run.png").stat().st_size > 10_000
