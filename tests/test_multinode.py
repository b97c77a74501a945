"""``gnnpipe train`` across nodes: two hosts in network namespaces over a veth pair, a Slurm step on loopback
(with a node dying and the rerun resuming), and nodes that read different builds refusing to start.

The pipeline up to hotness is built once per module; every test trains in its own copy of that artifact root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from flows.config import STAGES, make_config
from storage import ArtifactStore
from tests import _netns
from tests._multihost import (
    CONFIG,
    JOB_TIMEOUT_S,
    JOIN,
    assert_same_training,
    background,
    build_locally,
    copy_of,
    describe,
    on_host,
    run_nodes,
    train_on_one_host,
    train_on_two_hosts,
)
from tests.conftest import GNNPIPE, MOTO_ENV, REPO, cli_env, moto_server_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_locally(tmp_path_factory.mktemp("multinode") / "artifacts")


@pytest.fixture
def job(built: Path, tmp_path: Path) -> dict[str, Any]:
    return copy_of(built, tmp_path)


@pytest.fixture(scope="module")
def one_host(built: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of the job trained on this machine alone (2 ranks, no fault), from its own copy of the built
    artifacts: what every multi-node run here must reproduce exactly. Trained once for the module (it is the same
    training each time: same artifacts, same config)."""
    return train_on_one_host(copy_of(built, tmp_path_factory.mktemp("one-host")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workers_left(root: Path) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "stages.train.rank.worker" in " ".join(p.info["cmdline"] or []) and str(root) in " ".join(
                p.info["cmdline"] or [])]


@dataclass(frozen=True)
class Root:
    """An artifact root as the two hosts see it: its URL, the environment that reaches it, and how the test reads
    the train artifact's summary."""

    url: str
    env: dict[str, str]
    train_summary: Callable[[], dict[str, Any]]


@contextmanager
def shared_directory(job: dict[str, Any], net: _netns.TwoHosts) -> Iterator[Root]:
    """Both hosts read the same directory (a shared file system)."""
    yield Root(str(job["root"]), {}, lambda: job["store"].load("train", job["key"]).summary)


_BUILD_ON_S3 = """
import json, sys, time
import s3fs
for _ in range(100):   # the server is starting in the background
    try:
        s3fs.S3FileSystem().mkdir("gnnpipe-nodes"); break
    except Exception:
        time.sleep(0.2)
from tests._train_pipeline import build_without_prefect
build_without_prefect(json.loads(sys.argv[1]))
"""
_TRAIN_SUMMARY = """
import json, sys
from storage import ArtifactStore
print(json.dumps(ArtifactStore(sys.argv[1]).load("train", sys.argv[2]).summary))
"""


@contextmanager
def s3_bucket_on_host_a(job: dict[str, Any], net: _netns.TwoHosts) -> Iterator[Root]:
    """An S3 server on host a; host a builds the pipeline up to hotness there, and both hosts train from it:
    the hosts share nothing but the veth link."""
    moto = moto_server_path()
    if moto is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    env = {**MOTO_ENV, "AWS_ENDPOINT_URL": f"http://{net.addr[0]}:9000"}
    with background(net, 0, [moto, "-H", net.addr[0], "-p", "9000"], job["root"].parent / "moto.log"):
        url = "s3://gnnpipe-nodes/run"
        on_host(net, 0, _BUILD_ON_S3, env, json.dumps({**CONFIG, "artifacts": url, "until": "hotness"}))
        yield Root(url, env, lambda: json.loads(on_host(net, 0, _TRAIN_SUMMARY, env, url, job["key"])))


@pytest.mark.parametrize("artifact_root", [shared_directory, s3_bucket_on_host_a], ids=["shared-dir", "s3"])
def test_two_hosts_in_network_namespaces_train_like_one_host(job: dict[str, Any], artifact_root: Any,
                                                            request: pytest.FixtureRequest):
    reason = _netns.unavailable()
    if reason:
        pytest.skip(f"no two-host network on this machine: {reason}")
    one_host = request.getfixturevalue("one_host")   # not trained where the test skips
    with _netns.two_hosts() as net, artifact_root(job, net) as root:
        results = train_on_two_hosts(net, job, root.url, root.env)
        crossed = [net.rx_bytes(i) for i in (0, 1)]
        assert [r.returncode for r in results] == [0, 0], describe(results)
        assert "node 0 publishes" in results[1].stdout
        two_hosts = root.train_summary()
    # one_host trained from a local copy of the same builds (one host training from S3: tests/test_s3.py)
    assert (two_hosts["nodes"], two_hosts["world_size"], one_host["nodes"]) == (2, 2, 1)
    # everything between the nodes went over the veth link, the only way out of each namespace
    assert min(crossed) > two_hosts["remote_bytes_per_epoch"] * len(two_hosts["epochs"]), crossed
    assert_same_training(two_hosts, one_host)


def _slurm_env(node: int) -> dict[str, str]:
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2",
            "SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_NODEID": str(node)}


def test_slurm_step_fails_fast_when_a_node_dies_and_the_rerun_resumes(job: dict[str, Any], one_host: dict[str, Any]):
    port = str(_free_port())
    commands = [[*GNNPIPE, "train", "-c", job["cfg"], "--slurm", "--port", port, *JOIN]] * 2
    start = time.monotonic()
    # whichever node hosts rank 1 loses it at the start of epoch 2, as a crashed machine would
    results = run_nodes(commands, [{**_slurm_env(i), "GNNPIPE_TRAIN_FAULT": "1:1:0"} for i in (0, 1)])
    elapsed = time.monotonic() - start
    assert all(r.returncode != 0 for r in results), describe(results)
    errors = [r.stderr.strip().splitlines()[-1] for r in results]
    assert any("rank 1 was killed by SIGKILL" in e for e in errors), errors
    assert all(e.startswith("error: training failed: rank ") for e in errors), errors
    assert elapsed < 120, f"took {elapsed:.0f} s to notice a dead node"
    assert not _workers_left(job["root"])
    assert job["store"].find("train", job["key"]) is None

    rerun = run_nodes(commands, [_slurm_env(i) for i in (0, 1)])
    assert [r.returncode for r in rerun] == [0, 0], describe(rerun)
    summary = job["store"].load("train", job["key"]).summary
    assert summary["resumed_from_epoch"] == 0 and summary["nodes"] == 2
    assert len(summary["epochs"]) == CONFIG["epochs"]
    assert not (job["root"] / ".checkpoints" / f"train-{job['key']}").exists(), "both nodes clean up"
    # resumed on two nodes = uninterrupted on one: every rank's RNG state travels in the checkpoint
    assert one_host["resumed_from_epoch"] is None
    assert_same_training(summary, one_host)


def _two_local_nodes(job: dict[str, Any], extra: tuple[list[str], list[str]]) -> list[subprocess.CompletedProcess]:
    rdzv = f"127.0.0.1:{_free_port()}"
    return run_nodes([[*GNNPIPE, "train", "-c", job["cfg"], "--nnodes", "2", "--node-rank", str(i), "--rdzv", rdzv,
                       *JOIN, *extra[i]] for i in (0, 1)], [{}, {}])


def _last_error_lines(results: list[subprocess.CompletedProcess]) -> list[str]:
    assert [r.returncode for r in results] == [2, 2], describe(results)
    return [r.stderr.strip().splitlines()[-1] for r in results]


def test_the_other_node_fails_fast_when_a_whole_node_is_killed(job: dict[str, Any], tmp_path: Path):
    """Node 0 (the rendezvous server, its torchrun and its ranks) vanishes at once, as a machine losing power
    would, while its connections are closed by the kernel: node 1 must stop by itself, quickly."""
    rdzv = f"127.0.0.1:{_free_port()}"
    logs = [tmp_path / f"node{i}.log" for i in (0, 1)]
    procs = []
    for i in (0, 1):
        with open(logs[i], "w") as out:
            procs.append(subprocess.Popen([*GNNPIPE, "train", "-c", job["cfg"], "--set", "epochs=500", "--nnodes",
                                           "2", "--node-rank", str(i), "--rdzv", rdzv, *JOIN], cwd=REPO,
                                          env=cli_env(), stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not any("epoch 2/500" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and procs[1].poll() is None, logs[1].read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(procs[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        procs[1].wait(timeout=120)
        noticed = time.monotonic() - killed
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    last = logs[1].read_text().strip().splitlines()[-1]
    assert procs[1].returncode != 0 and last.startswith("error: training failed: rank "), last
    assert noticed < 60, f"node 1 took {noticed:.0f} s to notice"
    assert not _workers_left(job["root"])


def test_a_node_with_its_own_build_of_a_stage_or_another_config_refuses_to_start(job: dict[str, Any],
                                                                                tmp_path: Path):
    """Node 1 has hotness rebuilt under the same key in its copy, as if each machine had run the pipeline itself,
    and another epoch count: both nodes refuse, naming what differs (the two) and nothing else (one job of two
    launches proves both; each cost ~19 s apart)."""
    other = tmp_path / "other-node"
    shutil.copytree(job["root"], other)
    cfg = make_config(**{**CONFIG, "artifacts": str(other)})
    store = ArtifactStore(other)
    upstream = {u: store.load(u, job["keys"][u]) for u in STAGES["hotness"].UPSTREAM}
    STAGES["hotness"].run(store, cfg.stage_params("hotness"), upstream, force=True, progress=False)

    results = _two_local_nodes(job, ([], ["--artifacts", str(other), "--set", "epochs=4"]))
    for line in _last_error_lines(results):
        assert "does not train on the artifacts of node" in line and f"hotness: {job['keys']['hotness']} build" in line
        assert f"train: {job['key']} on node" in line
        assert "partition:" not in line and "features:" not in line
    assert job["store"].find("train", job["key"]) is None and store.find("train", job["key"]) is None


def test_a_node_left_alone_gives_up_at_the_join_timeout(job: dict[str, Any], tmp_path: Path):
    tmp = tmp_path / "tmp"   # torchrun's own default for its folder of attempts, which it never removes
    tmp.mkdir()
    lone = subprocess.run([*GNNPIPE, "train", "-c", job["cfg"], "--nnodes", "2", "--rdzv",
                           f"127.0.0.1:{_free_port()}", "--join-timeout", "3"], cwd=REPO,
                          env={**cli_env(), "TMPDIR": str(tmp)}, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    assert lone.returncode != 0
    assert lone.stderr.strip().splitlines()[-1].startswith("error: the other nodes did not join the rendezvous at "
                                                           "127.0.0.1:")
    assert not list(tmp.iterdir()) and not list(job["root"].rglob("torchrun"))


def test_train_command_rejects_bad_cluster_setups_before_reading_anything(tmp_path: Path):
    def gnnpipe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*GNNPIPE, "train", "--artifacts", str(tmp_path / "none"), *args], cwd=REPO,
                              env=cli_env(), capture_output=True, text=True, timeout=120)

    uneven = gnnpipe("--set", "num_partitions=3", "--nnodes", "2", "--rdzv", "127.0.0.1:29400")
    assert uneven.returncode == 2 and "error: 3 partitions on 2 nodes" in uneven.stderr
    unbuilt = gnnpipe("--set", "num_partitions=2")
    assert unbuilt.returncode == 2 and "is not in" in unbuilt.stderr and "gnnpipe run --until hotness" in unbuilt.stderr
    not_slurm = subprocess.run([*GNNPIPE, "train", "--slurm"], cwd=REPO, capture_output=True, text=True, timeout=120,
                               env={k: v for k, v in cli_env().items() if not k.startswith("SLURM_")})
    assert not_slurm.returncode == 2 and "SLURM_JOB_ID is not set" in not_slurm.stderr
    assert not (tmp_path / "none").exists()


def test_without_privilege_the_two_host_test_says_why_it_skips(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in (_netns.unavailable() or "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "iproute2" in (_netns.unavailable() or "")
