"""Faults on the Dask executor (issue 29, item 4; ``stages.executor``'s module doc states each guarantee).

- A worker SIGKILLed while it runs a features unit: Dask reschedules the unit, which rewrites its parts' stores
  over what the dead attempt left, and the build is byte-identical to the local one. With no failure allowed
  (``allowed_failures`` 0) the stage fails in one line instead, leaves nothing, and a rerun finishes it. The same
  kill under ``gnnpipe run`` (the units task runs of a flow run on a Prefect server): the run exits 0, same bytes.
- Ctrl-C during the units: ``gnnpipe run`` exits within seconds; the run's own cluster is gone (no worker process
  left) and nothing is half-written; on an external cluster the scheduler holds none of the run's tasks.
- ``.reach-*`` token files a killed check left: ``gnnpipe clean`` removes them, ``status`` shows nothing of them.

The units of a tiny graph last ~0.1 s, so a test acts while one is paused (``tests._fault_units``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from flows.direct import run_stages
from stages.features import stage as features
from storage import ArtifactStore, InputError
from storage.features import FeatureScheme, PartFeaturesWriter, write_part_features
from storage.graph import SPLITS
from storage.reach import reach_token
from storage.writer import WorkDir
from tests import _fault_units
from tests._cli_runs import GnnpipeRun
from tests.conftest import TINY, artifact_files

# 3 parts on 2 workers: one unit holds parts 0 and 1 (the one paused), the other part 2; 256-row chunks: part 0's x
# is several chunks, all written before the pause
LAYOUT: dict[str, Any] = {"num_partitions": 3, "chunk_rows": 256}
EXIT_WITHIN_S = 10.0   # from the signal to gnnpipe's exit (issue 12's bound; measured 2-3 s, as a local run)
WAIT_S = 120.0         # for a paused unit: the run's cluster starts and the flow reaches the features stage


def cli(*args: str) -> Any:
    """``gnnpipe ARGS`` in this process; stdout in ``.stdout``."""
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, list(args), env={"ARTIFACTS": None, "GNNPIPE_ORIGIN": None})
    assert result.exit_code == 0, result.output
    return result


def _features_files(root: Path) -> list[str]:
    """What a features build left under the root, by path (an empty list: nothing)."""
    base = root / "features"
    return sorted(str(p.relative_to(base)) for p in base.rglob("*")) if base.exists() else []


def test_rewriting_a_partial_store_gives_the_same_bytes(tmp_path: Path) -> None:
    """A unit rescheduled after its worker died opens its part's store again (mode "w") over what the dead
    attempt wrote: some x chunks, a torn chunk (Zarr writes ``<chunk>.<uuid>.partial`` and renames it: a kill
    leaves that file, which no later write replaces), no y nor attrs. The result is the store of a clean write."""
    rng = np.random.default_rng(0)
    rows = {"node": rng.standard_normal((1000, 8)).astype(np.float32)}
    args: dict[str, Any] = {"part": 0, "start_gid": 0, "features": rows, "y": rng.integers(0, 4, 1000),
                            "split_lids": {s: np.arange(i, 1000, 7) for i, s in enumerate(SPLITS)},
                            "num_classes": 4, "chunk_rows": {"node": 128}}
    clean, again = WorkDir(str(tmp_path / "clean")), WorkDir(str(tmp_path / "again"))
    write_part_features(clean, **args)
    dead = PartFeaturesWriter(again, part=0, start_gid=0, shapes={"node": (1000, 8)}, chunk_rows={"node": 128},
                              schemes={"node": FeatureScheme("cast", "float32")})
    dead.x["node"][:384] = rows["node"][:384]
    Path(again.file_url("part-0.zarr/x/node/c/3.4f1c0a9e.partial")).write_bytes(b"\x00" * 17)
    write_part_features(again, **args)
    want, got = ({str(f.relative_to(d)): f.read_bytes() for f in sorted(Path(d).rglob("*")) if f.is_file()}
                 for d in (clean.url, again.url))
    assert sorted(got) == sorted(want) and [f for f in got if got[f] != want[f]] == []


# ---- a worker killed mid-stage ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Any]:
    """A cluster of 2 worker processes with nannies (a killed worker is restarted) that these tests may kill
    workers of: not the session's ``dask_cluster``, which other tests share."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster:
        yield cluster


def _kill_when_held(control: Path, client: Any) -> threading.Thread:
    """SIGKILL the worker whose unit paused, once it is the only unit running (the other unit done, so what is
    left under the root is the killed unit's alone); the thread's ``killed`` is the pid."""
    def kill() -> None:
        deadline = time.monotonic() + WAIT_S
        while not (control / "held").exists() or sum(len(t) for t in client.processing().values()) > 1:
            assert time.monotonic() < deadline, "no unit paused"
            time.sleep(0.05)
        pid = int((control / "held").read_text())
        assert pid in client.run(os.getpid).values()   # a worker of that cluster
        os.kill(pid, signal.SIGKILL)
        thread.killed = pid   # type: ignore[attr-defined]

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_worker_killed_mid_unit_changes_no_byte(tmp_path: Path, own_cluster: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Dask reschedules the dead worker's unit (allowed_failures 3, its default), which rewrites parts 0 and 1."""
    from distributed import Client

    store, built = run_stages({**TINY, **LAYOUT, "artifacts": str(tmp_path / "art"), "until": "features"})
    local = built["features"]
    want = artifact_files(store, local)
    monkeypatch.setattr(_fault_units.units, "write_parts", _fault_units.held_write_parts)
    with Client(own_cluster) as client:
        client.wait_for_workers(2, timeout=WAIT_S)   # a worker killed by an earlier test is back
        killer = _kill_when_held(tmp_path, client)
        params = features.Params(**{**local.params, "executor": own_cluster.scheduler_address})
        got = features.run(store, params, {u: built[u] for u in features.UPSTREAM}, force=True, progress=False)
        killer.join(timeout=10)
        assert killer.killed not in client.run(os.getpid).values()   # type: ignore[attr-defined]
    files = artifact_files(store, got)
    assert got.key == local.key and sorted(files) == sorted(want) and [f for f in files if files[f] != want[f]] == []
    assert got.digests == local.digests
    assert [u["parts"] for u in got.summary["units"]] == [[0, 1], [2]]


@pytest.mark.slow
def test_a_unit_that_kills_every_worker_fails_in_one_line(tmp_path: Path, own_cluster: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With no failure allowed, the first death fails the stage: one line naming the unit, no manifest, no work
    directory; the rerun (the unit no longer pauses) builds what a local run builds."""
    from distributed import Client

    _, reference = run_stages({**TINY, **LAYOUT, "artifacts": str(tmp_path / "ref" / "art"), "until": "features"})
    store, built = run_stages({**TINY, **LAYOUT, "artifacts": str(tmp_path / "art"), "until": "partition"})
    monkeypatch.setattr(_fault_units.units, "write_parts", _fault_units.held_write_parts)
    params = features.Params(**{**reference["features"].params, "executor": own_cluster.scheduler_address})
    upstream = {u: built[u] for u in features.UPSTREAM}
    scheduler = own_cluster.scheduler
    monkeypatch.setattr(scheduler, "allowed_failures", 0)
    with Client(own_cluster) as client:
        client.wait_for_workers(2, timeout=WAIT_S)
        killer = _kill_when_held(tmp_path, client)
        with pytest.raises(InputError, match=r"^1 Dask worker died running unit features-unit-parts-0-1 "
                                             r"\(the last: tcp://\S+\); nothing of this build was kept") as err:
            features.run(store, params, upstream, progress=False)
        killer.join(timeout=10)
    assert "\n" not in str(err.value)
    assert _features_files(tmp_path / "art") == []
    monkeypatch.setattr(scheduler, "allowed_failures", 3)
    got = features.run(store, params, upstream, progress=False)
    assert got.key == reference["features"].key and got.digests == reference["features"].digests
    assert artifact_files(store, got) == artifact_files(ArtifactStore(str(tmp_path / "ref" / "art")),
                                                        reference["features"])


@pytest.mark.slow
def test_a_worker_killed_inside_a_flow_run_changes_no_byte(tmp_path: Path, own_cluster: Any,
                                                            prefect_server: str) -> None:
    """The same kill under ``gnnpipe run --set executor=tcp://...`` against a Prefect server: the units are task
    runs of the flow run on the cluster's workers; the dead worker's unit is rescheduled, the run exits 0 and its
    features build is byte-identical to a local one."""
    from distributed import Client

    _, reference = run_stages({**TINY, **LAYOUT, "artifacts": str(tmp_path / "ref" / "art"), "until": "features"})
    want = reference["features"]
    with Client(own_cluster) as client:
        client.wait_for_workers(2, timeout=WAIT_S)
        killer = _kill_when_held(tmp_path, client)
        run, root = held_run(tmp_path, own_cluster.scheduler_address, prefect_server)
        killer.join(timeout=WAIT_S)
        assert run.proc.wait(timeout=WAIT_S) == 0, "".join(run.lines)[-3000:]
        assert killer.killed not in client.run(os.getpid).values()   # type: ignore[attr-defined]
    store = ArtifactStore(str(root))
    got = store.find("features", want.key)
    assert got is not None and got.digests == want.digests
    assert artifact_files(store, got) == artifact_files(ArtifactStore(str(tmp_path / "ref" / "art")), want)


# ---- Ctrl-C --------------------------------------------------------------------------------------------------------
def held_run(tmp: Path, executor: str, api_url: str) -> tuple[GnnpipeRun, Path]:
    """``gnnpipe run --until features`` with the features unit paused (``tests._fault_units.cli``), on a root whose
    download and partition are built; returns once the unit is paused, and the root."""
    values = {**TINY, **LAYOUT}
    root = tmp / "art"
    run_stages({**values, "artifacts": str(root), "until": "partition"})
    args = [a for k, v in {**values, "executor": executor}.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    run = GnnpipeRun(["--until", "features", *args, "--artifacts", str(root)], api_url,
                     gnnpipe=[sys.executable, "-c", "from tests._fault_units import cli; cli()"])
    deadline = time.monotonic() + WAIT_S
    while not (tmp / "held").exists():
        assert run.proc.poll() is None, f"gnnpipe exited early:\n{''.join(run.lines)[-3000:]}"
        assert time.monotonic() < deadline, f"no unit paused after {WAIT_S} s:\n{''.join(run.lines)[-3000:]}"
        time.sleep(0.05)
    return run, root


def _dask_workers(tree: dict[psutil.Process, str]) -> list[psutil.Process]:
    """The spawned processes in ``tree`` (with their command lines): a LocalCluster's workers (gnnpipe spawns
    nothing else)."""
    return [p for p, cmd in tree.items() if "spawn_main" in cmd]


@pytest.mark.slow
def test_ctrl_c_stops_the_runs_own_cluster(tmp_path: Path, prefect_server: str) -> None:
    """executor=dask:2: gnnpipe exits within seconds, with its one line; no worker process is left, and neither
    is any file of the build (the workers were killed before the work directory was removed)."""
    run, root = held_run(tmp_path, "dask:2", prefect_server)
    tree, elapsed = run.signal_group(signal.SIGINT)
    said = run.last_line()
    assert run.proc.returncode == 130 and elapsed < EXIT_WITHIN_S, (said, elapsed)
    assert said.startswith("interrupted by SIGINT during stage features; rerun the same command")
    assert len(_dask_workers(tree)) == 2, tree
    _, alive = psutil.wait_procs(list(tree), timeout=3)   # slack for the kernel to reap what just exited
    assert [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    time.sleep(1)   # a unit left running would write again now
    assert _features_files(root) == []


@pytest.mark.slow
def test_ctrl_c_cancels_the_runs_tasks_on_an_external_cluster(tmp_path: Path, dask_cluster: str,
                                                               prefect_server: str) -> None:
    """executor=tcp://...: the scheduler holds none of the run's tasks once gnnpipe has exited. The unit already
    running goes on (Dask cannot stop a task in its thread) and writes into the abandoned work directory, never
    taken for a build; ``gnnpipe clean`` removes it."""
    from distributed import Client

    run, root = held_run(tmp_path, dask_cluster, prefect_server)
    _, elapsed = run.signal_group(signal.SIGINT)
    said = run.last_line()
    assert run.proc.returncode == 130 and elapsed < EXIT_WITHIN_S, (said, elapsed)
    with Client(dask_cluster) as client:
        deadline = time.monotonic() + 5
        while any(client.processing().values()) or client.who_has():
            assert time.monotonic() < deadline, (client.processing(), client.who_has())
            time.sleep(0.1)
    store = ArtifactStore(str(root))
    (tmp_path / "release").touch()
    deadline = time.monotonic() + 30
    while not (tmp_path / "ended").exists():   # the worker's thread is free again for the next test
        assert time.monotonic() < deadline
        time.sleep(0.05)
    left = _features_files(root)
    assert all(p.startswith(".tmp-") for p in left) and store.find("features", features_key(store)) is None
    assert "being written, or left by a killed run" in cli("status", "--artifacts", store.root).stdout
    cli("clean", "--stage", "features", "--artifacts", store.root)
    assert _features_files(root) == []


def features_key(store: ArtifactStore) -> str:
    """The key of the features build of TINY + LAYOUT."""
    from flows.config import make_config, stage_keys

    return stage_keys(make_config({**TINY, **LAYOUT, "artifacts": store.root}))["features"]


# ---- the reach check's token ---------------------------------------------------------------------------------------
def test_clean_removes_a_killed_checks_token(tmp_path: Path) -> None:
    """A SIGKILL between writing ``.reach-<token>`` and removing it leaves the file: ``status`` shows nothing of it,
    ``clean`` removes it."""
    store, _ = run_stages({**TINY, "artifacts": str(tmp_path / "art"), "until": "download"})
    check = reach_token(store)
    url, _ = check.__enter__()   # never left, as under a SIGKILL
    assert Path(url).exists()
    status = cli("status", "--artifacts", store.root).stdout
    assert ".reach" not in status and "download: 1 build" in status
    out = cli("clean", "--artifacts", store.root).stdout
    assert f"removed {url} (left by a run killed" in out and not Path(url).exists()
    assert cli("clean", "--artifacts", store.root).stdout.strip() == f"nothing to remove in {store.root}"
    check.__exit__(None, None, None)   # the check's own removal finds the file gone: no error
