"""Where a data stage's units run (``stages.executor``): the features stage built on a real ``distributed``
cluster of 2 worker processes has the key and every byte of the one built in-process; a worker that cannot reach
the artifact root fails the stage in one line before anything is written; inside a Prefect flow the units are
task runs of the stage's task; the executor never enters a key."""

from __future__ import annotations

from typing import Any

import pytest

from flows.config import STAGES, make_config, stage_keys
from flows.direct import run_stages
from stages import executor
from stages.features import stage as features
from storage import ArtifactStore, InputError
from tests.conftest import TINY, artifact_files

DATA_STAGES = ("download", "partition", "features", "hotness")
# 3 parts on 2 workers: one unit holds two parts, the other one; int8 + l1 send per-column scales to the units;
# 256-row chunks give each part several
LAYOUT: dict[str, Any] = {"num_partitions": 3, "dtype": "int8", "normalize": "l1", "chunk_rows": 256}


@pytest.mark.parametrize("text, spec", [
    ("local", executor.ExecutorSpec("local")), ("dask", executor.ExecutorSpec("dask")),
    ("dask:3", executor.ExecutorSpec("dask", workers=3)),
    (" tcp://10.0.0.5:8786", executor.ExecutorSpec("address", address="tcp://10.0.0.5:8786"))])
def test_executor_values(text: str, spec: executor.ExecutorSpec) -> None:
    assert executor.parse_executor(text) == spec


@pytest.mark.parametrize("bad", ["dask:0", "dask:x", "threads", "tcp://host", "http://h:1"])
def test_bad_executor_is_one_line(bad: str) -> None:
    with pytest.raises(InputError, match=r"invalid parameter executor=.*expected local, dask, dask:N") as err:
        make_config(TINY, executor=bad)
    assert "\n" not in str(err.value)


def test_executor_is_runtime_in_every_data_stage() -> None:
    """One flat name sets it in the four data stages, and no key changes with it."""
    cfg = make_config(TINY, executor="tcp://10.0.0.5:8786")
    for name in DATA_STAGES:
        assert cfg.stage_params(name).executor == "tcp://10.0.0.5:8786"   # type: ignore[attr-defined]
        assert "executor" in STAGES[name].Params.runtime_fields()
    assert stage_keys(cfg) == stage_keys(make_config(TINY))


@pytest.mark.slow
def test_dask_build_is_byte_identical(tmp_path: Any) -> None:
    """Outside a run's scope, executor=dask:2 starts a cluster of its own and writes the same files under the same
    key as the local build it replaces (forced)."""
    store, built = run_stages({**TINY, **LAYOUT, "artifacts": str(tmp_path / "a"), "until": "features"})
    local = built["features"]
    want = artifact_files(store, local)
    params = features.Params(**{**local.params, "executor": "dask:2"})
    got = features.run(store, params, {u: built[u] for u in features.UPSTREAM}, force=True, progress=False)
    assert got.key == local.key and got.build_id != local.build_id
    assert artifact_files(store, got) == want


@pytest.mark.slow
def test_a_run_builds_every_data_stage_on_one_cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a run (``run_scope``) the four data stages share the one dask:2 cluster the first of them started,
    stopped after them, and each stage is the local build's under its key, file for file and digest for digest."""
    values = {**TINY, **LAYOUT, "until": "hotness"}
    store, local = run_stages({**values, "artifacts": str(tmp_path / "local")})
    started: list[str] = []
    real = executor._runner
    monkeypatch.setattr(executor, "_runner", lambda spec, units: started.append(str(spec)) or real(spec, units))
    dask_store, on_dask = run_stages({**values, "artifacts": str(tmp_path / "dask"), "executor": "dask:2"})
    assert len(started) == 1 and executor._Scope.current is None
    for name in DATA_STAGES:
        assert on_dask[name].key == local[name].key
        assert artifact_files(dask_store, on_dask[name]) == artifact_files(store, local[name]), name
        assert (on_dask[name].files, on_dask[name].digests) == (local[name].files, local[name].digests), name
    for name in ("features", "hotness"):   # 3 parts on 2 slots
        s = on_dask[name].summary
        assert s["executor_slots"] == 2 and [u["parts"] for u in s["units"]] == [[0, 1], [2]], name
    assert on_dask["features"].summary["parts"] == local["features"].summary["parts"]


def test_a_worker_without_the_prefect_api_is_said() -> None:
    """The check a worker runs before units become task runs: why the API does not answer (here: a port bound
    but not listening)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert "URLError" in (executor.api_problem(f"http://127.0.0.1:{sock.getsockname()[1]}/api") or "")


@pytest.mark.slow
def test_unreachable_root_fails_before_any_write(dask_cluster: str) -> None:
    """A ``memory://`` root lives in this process only: the workers, other processes, cannot see it. The stage
    fails in one line naming a worker and the root, and leaves nothing under the root's features directory."""
    store, built = run_stages({**TINY, "artifacts": "memory://gnnpipe-reach", "until": "partition"})
    params = features.Params(executor=dask_cluster)
    with pytest.raises(InputError, match=r"Dask worker tcp://\S+ cannot reach the artifact root memory://gnnpipe-reach"
                       ) as err:
        features.run(store, params, {u: built[u] for u in features.UPSTREAM}, progress=False)
    assert "\n" not in str(err.value)
    assert not store.fs.exists(f"{store.base}/features")
    assert [p for p in store.fs.ls(store.base) if ".reach-" in p] == []


@pytest.mark.slow
def test_units_are_prefect_task_runs(tiny: dict[str, Any], dask_cluster: str, prefect_server: str) -> None:
    """Through the flow, each unit is a task run on the cluster whose parent is the features stage's task run."""
    from prefect.client.orchestration import get_client

    from flows.config import flow_parameters
    from flows.pipeline import pipeline

    cfg = make_config(tiny, until="features", executor=dask_cluster)
    state = pipeline(**flow_parameters(cfg), return_state=True)
    results = state.result()
    assert results["features"]["state"] == "Completed"
    with get_client(sync_client=True) as client:   # this flow run's: other tests share the server
        runs = [r for r in client.read_task_runs() if r.flow_run_id == state.state_details.flow_run_id]
    stage = [r for r in runs if r.name.startswith("features-") and not r.name.startswith("features-unit")]
    units = [r for r in runs if r.name.startswith("features-unit-part-")]
    assert len(stage) == 1 and sorted(r.name for r in units) == ["features-unit-part-0", "features-unit-part-1"]
    for unit in units:
        assert unit.state_name == "Completed" and unit.flow_run_id == stage[0].flow_run_id
        assert [str(p.id) for p in unit.task_inputs["__parents__"]] == [str(stage[0].id)]
    store = ArtifactStore(tiny["artifacts"])
    assert store.find("features", results["features"]["key"]) is not None


def test_the_run_scope_stops_its_cluster_before_a_stage_without_units() -> None:
    """The data stages keep the run's cluster; the first stage whose Params has no ``executor`` (train) stops it,
    so its ranks get the workers' CPUs and memory."""
    cfg = make_config(TINY, executor="dask:2")
    exits: list[str] = []

    class Runner:
        def __exit__(self, *exc: object) -> None:
            exits.append("closed")

    with executor.run_scope() as before_stage:
        scope = executor._Scope.current
        assert scope is not None
        scope.runners["dask:2"] = Runner()
        for name in DATA_STAGES:
            before_stage(cfg.stage_params(name))
        assert exits == [] and list(scope.runners) == ["dask:2"]
        before_stage(cfg.stage_params("train"))
        assert exits == ["closed"] and scope.runners == {}
    assert exits == ["closed"] and executor._Scope.current is None
