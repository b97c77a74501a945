"""What the multi-host tests share: the small job they build and train, a node's processes started together, one
host's training as the reference every multi-node run must equal, the two-host training launch, and background
services (a scheduler, workers, a server) on a host that are stopped however the test ends.

``tests/test_multinode.py`` trains across nodes; ``tests/test_multihost_preprocess.py`` builds the data stages
on a Dask cluster spread over two hosts first, then trains on them the same way.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows import services
from flows.config import make_config, stage_keys
from storage import ArtifactStore
from tests import _netns
from tests._train_pipeline import build_without_prefect
from tests.conftest import GNNPIPE, REPO, TINY, cli_env

CONFIG = {**TINY, "fanouts": [5, 5], "batch_size": 64, "hidden": 32, "epochs": 3}
JOB_TIMEOUT_S = 240
JOIN = ["--join-timeout", "60"]   # a node that fails before joining must not keep the other waiting for 10 minutes
# uvicorn, a Dask scheduler and a nanny stop in well under a second on SIGTERM; a worker that hangs is killed
STOP_GRACE_S = 10.0


def build_locally(root: Path) -> Path:
    """The pipeline up to hotness built in this process, in one place: what every multi-host run starts from or
    must equal."""
    build_without_prefect({**CONFIG, "artifacts": str(root), "until": "hotness"})
    return root


def job_at(root: Path, tmp_path: Path) -> dict[str, Any]:
    """The training job on the artifacts under ``root``: a config file naming it, the stage keys, the store."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "artifacts": str(root)}))
    keys = stage_keys(make_config(**{**CONFIG, "artifacts": str(root)}))
    return {"root": root, "cfg": str(cfg), "keys": keys, "key": keys["train"], "store": ArtifactStore(root)}


def copy_of(built: Path, tmp_path: Path) -> dict[str, Any]:
    """The job on a private copy of the built artifacts (byte for byte: the same builds)."""
    root = tmp_path / "artifacts"
    shutil.copytree(built, root)
    return job_at(root, tmp_path)


def run_nodes(commands: list[list[str]], envs: list[dict[str, str]], timeout_s: float = JOB_TIMEOUT_S
              ) -> list[subprocess.CompletedProcess]:
    """Start one process per node at once, wait for all; on a timeout kill every node's process group."""
    procs = [subprocess.Popen(cmd, cwd=REPO, env={**cli_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for cmd, env in zip(commands, envs)]
    deadline = time.monotonic() + timeout_s
    results = []
    try:
        for cmd, proc in zip(commands, procs):
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results


def describe(results: list[subprocess.CompletedProcess]) -> str:
    return "\n".join(f"--- node {i} rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                     for i, r in enumerate(results))


def train_on_one_host(job: dict[str, Any]) -> dict[str, Any]:
    """Train the job's artifact on this machine alone (2 ranks); its summary."""
    single = subprocess.run([*GNNPIPE, "train", "-c", job["cfg"]], cwd=REPO, env=cli_env(),
                            capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert single.returncode == 0, single.stderr[-3000:]
    summary = job["store"].load("train", job["key"]).summary
    assert (summary["nodes"], summary["world_size"], summary["resumed_from_epoch"]) == (1, 2, None), summary
    return summary


def train_on_two_hosts(net: _netns.TwoHosts, job: dict[str, Any], url: str, env: dict[str, str]
                       ) -> list[subprocess.CompletedProcess]:
    """``gnnpipe train`` with one node (one rank) on each host, the rendezvous on host a, reading the artifact
    root at ``url`` (with ``env`` to reach it); both nodes' results, once both have ended."""
    rdzv = f"{net.addr[0]}:29400"
    commands = [[*net.exec_prefix(i), *GNNPIPE, "train", "-c", job["cfg"], "--artifacts", url, "--nnodes", "2",
                 "--node-rank", str(i), "--rdzv", rdzv, "--local-addr", net.addr[i], *JOIN] for i in (0, 1)]
    return run_nodes(commands, [{**env, "GLOO_SOCKET_IFNAME": net.ifname[i]} for i in (0, 1)])


def assert_same_training(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Same seeds, same rank per partition, and a 2-rank all-reduce is exact: the very same training."""
    assert (a["test_metric"], a["best_val_metric"]) == (b["test_metric"], b["best_val_metric"])
    assert [e["loss"] for e in a["epochs"]] == pytest.approx([e["loss"] for e in b["epochs"]], rel=1e-6)


def on_host(net: _netns.TwoHosts, i: int, code: str, env: dict[str, str], *args: str) -> str:
    """Run a Python snippet on host ``i``; its stdout."""
    proc = subprocess.run([*net.exec_prefix(i), sys.executable, "-c", code, *args], cwd=REPO,
                          env={**cli_env(), **env}, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@contextmanager
def background(net: _netns.TwoHosts, i: int, argv: list[str], log: Path, env: dict[str, str] | None = None,
               setup: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running on host ``i`` in its own session, its output in ``log``, for the block; then its whole
    group gets SIGTERM and, after ``STOP_GRACE_S``, SIGKILL, however the block ends. ``setup``: a shell command
    run on the host first, in the process's own mount namespace (``ip netns exec`` gives it one), e.g. a mount
    that only this process sees."""
    cmd = [*net.exec_prefix(i), *argv] if setup is None else [
        *net.exec_prefix(i), "sh", "-c", f'{setup} && exec "$@"', "sh", *argv]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=log.parent, env={**cli_env(), **(env or {})}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        services.stop_group(proc.pid, STOP_GRACE_S, second_term=False)
        proc.wait()
        try:   # whatever the leader left behind in its group (a nanny's worker process)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
