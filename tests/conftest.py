"""Shared fixtures: a tiny pipeline configuration and one Prefect test server for the whole session."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", str(REPO / ".prefect-test"))
if os.environ.get("PYTEST_XDIST_WORKER"):   # `make test` runs files in parallel processes: a Prefect home each (its
    # profiles, local result storage and the temporary servers' SQLite files are not shared between processes)
    os.environ["PREFECT_HOME"] = str(Path(os.environ["PREFECT_HOME"]) / "xdist" / os.environ["PYTEST_XDIST_WORKER"])

# A graph small enough to run every stage in about a second, with community structure so METIS has a cut to find.
TINY: dict[str, Any] = {"dataset": "synthetic", "num_nodes": 3000, "avg_degree": 10.0, "num_features": 16,
                        "num_classes": 4, "seed": 1, "num_partitions": 2}


@pytest.fixture(scope="session")
def prefect_server() -> str:
    """One temporary Prefect server (SQLite in a temp dir) for all flow tests; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture(scope="session")
def dask_cluster() -> Iterator[str]:
    """One ``distributed.LocalCluster`` of 2 worker processes, 1 thread each, for every executor test (a start
    costs 5-10 s on the 2-core machine); yields its scheduler's address. A test that kills a worker starts its own."""
    import logging

    from distributed import LocalCluster

    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                      silence_logs=logging.WARNING) as lc:
        yield lc.scheduler_address


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models: OpenMP threads only add overhead, and on a busy 2-core machine spinning threads made a test ~10x
    slower (20 s instead of 2 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny(tmp_path: Path) -> dict[str, Any]:
    return {**TINY, "artifacts": str(tmp_path / "artifacts")}


def cli_env(api_url: str | None = None) -> dict[str, str]:
    """Environment for a ``gnnpipe`` subprocess: same interpreter, optionally the session's Prefect server."""
    # ARTIFACTS (exported by the Makefile) would override the artifact root of a test's config file
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "ARTIFACTS"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env["PYTHONUNBUFFERED"] = "1"
    return env


GNNPIPE = [sys.executable, "-m", "flows.cli"]


# Credentials a local moto server accepts, in the standard AWS variables (the endpoint is added per server).
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def moto_server_path() -> str | None:
    """moto's S3-compatible server (the ``moto[server]`` dev extra): beside this interpreter, or on PATH."""
    beside = Path(sys.executable).with_name("moto_server")
    return str(beside) if beside.exists() else shutil.which("moto_server")


def artifact_files(store: Any, manifest: Any) -> dict[str, bytes]:
    """Every file of a local artifact but its manifest (whose summary holds timings), by relative path: what two
    builds of one key must share byte for byte (the chunked and in-memory paths of a stage)."""
    root = Path(store.root) / manifest.stage / manifest.key
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
            if f.is_file() and f.name != "manifest.json"}


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """A 1-rank gloo group in this process: a trainer's, a loader's or a sampler's collectives without spawning."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
