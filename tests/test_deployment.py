"""Integration: a real Prefect server, the process pool, prefect.yaml's deployments, a worker, two runs.

Everything is started through the same CLI the Makefile uses (gnnpipe server/deploy/worker) with a temporary
PREFECT_HOME and a free loopback port, and stopped by PID at the end, also when the test fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TINY

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def latest_task_states(url: str) -> dict[str, str]:
    [flow_run] = api(url, "/flow_runs/filter", {"sort": "EXPECTED_START_TIME_DESC", "limit": 1})
    assert flow_run["state"]["name"] == "Completed", flow_run["state"]
    runs = api(url, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
    return {r["task_key"].split("-")[0].removesuffix("_stage"): r["state"]["name"] for r in runs}


@pytest.fixture
def services(tmp_path: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    # PYTHONPATH: the gnnpipe script (and the worker's flow runs) import this checkout, not the one the venv's
    # editable install points at
    # PREFECT_WORKER_QUERY_SECONDS: the worker looks for scheduled runs every second, not every 10 s (Prefect's
    # default): each deployment run below waited up to 10 s for the worker's next poll
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_PORT=str(port),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1", PREFECT_WORKER_QUERY_SECONDS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    gnnpipe = [str(BIN / "gnnpipe")]

    def cli(*args: str, timeout: float = 180) -> str:
        proc = subprocess.run([*gnnpipe, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    try:
        cli("server", "up")
        yield cli, env, f"http://127.0.0.1:{port}/api"
    finally:
        for name in ("worker", "server"):
            subprocess.run([*gnnpipe, name, "down"], cwd=REPO, env=env, capture_output=True, timeout=120)
        for name in ("worker", "server"):
            assert not (tmp_path / "prefect-home" / "run" / f"{name}.pid").exists(), f"{name} left running"


def test_deployment_run_completes_then_caches(services, tmp_path: Path):
    cli, env, url = services
    assert "gnnpipe/default" in cli("deploy")
    cli("worker", "up")
    artifacts = tmp_path / "artifacts"
    params = ["-p", f"artifacts={artifacts}", "-p", "until=features",
              *[arg for k, v in TINY.items() for arg in ("-p", f"{k}={v}")], "-p", "num_partitions=3"]

    def run_deployment() -> dict[str, str]:
        proc = subprocess.run([str(BIN / "prefect"), "deployment", "run", "gnnpipe/default", *params, "--watch"],
                              cwd=tmp_path, env={**env, "PREFECT_API_URL": url}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and "Completed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
        return latest_task_states(url)

    assert run_deployment() == {"download": "Completed", "partition": "Completed", "features": "Completed"}
    manifest = json.loads(next((artifacts / "partition").glob("*/manifest.json")).read_text())
    assert manifest["params"]["num_partitions"] == 3
    # the flow run, not the worker's command line inherited through its environment (`gnnpipe worker up`)
    assert manifest["origin"].startswith("deployment gnnpipe/default, flow run "), manifest["origin"]
    keys = {a["key"] for a in api(url, "/artifacts/filter", {})}
    assert {"gnnpipe-download", "gnnpipe-partition-report", "gnnpipe-features"} <= keys
    assert run_deployment() == {"download": "Cached", "partition": "Cached", "features": "Cached"}
