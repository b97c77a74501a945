"""Flow behaviour: caching, invalidation by parameter change or damaged artifact, force, concurrency, errors."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from flows.load import load_config
from storage import ArtifactStore, InputError
from storage.train_summary import TrainSummary
from tests.conftest import GNNPIPE, REPO, cli_env

pytestmark = pytest.mark.slow
STAGES = ("download", "partition", "features")


def run_flow(cfg: dict[str, Any], **extra: Any) -> dict[str, Any]:
    from flows.pipeline import pipeline

    return pipeline(**{**cfg, "until": "features", **extra})


def states(result: dict[str, Any]) -> dict[str, str]:
    return {name: res["state"] for name, res in result.items()}


def test_second_run_is_all_cached(prefect_server: str, tiny: dict[str, Any]):
    first = run_flow(tiny)
    assert states(first) == dict.fromkeys(STAGES, "Completed")
    second = run_flow(tiny)
    assert states(second) == dict.fromkeys(STAGES, "Cached")
    assert {n: r["key"] for n, r in first.items()} == {n: r["key"] for n, r in second.items()}
    assert len(ArtifactStore(tiny["artifacts"]).builds()) == 3


def test_num_partitions_reruns_partition_and_features_only(prefect_server: str, tiny: dict[str, Any]):
    first = run_flow(tiny)
    changed = run_flow(tiny, num_partitions=3)
    assert states(changed) == {"download": "Cached", "partition": "Completed", "features": "Completed"}
    assert changed["download"]["key"] == first["download"]["key"]
    assert changed["partition"]["key"] != first["partition"]["key"]


def test_deleted_file_reruns_that_stage(prefect_server: str, tiny: dict[str, Any]):
    first = run_flow(tiny)
    part_dir = Path(first["partition"]["uri"])
    victim = next(p for p in sorted((part_dir / "part-1.zarr").rglob("*")) if p.is_file() and "/c/" in str(p))
    victim.unlink()
    again = run_flow(tiny)
    assert states(again) == {"download": "Cached", "partition": "Completed", "features": "Cached"}
    assert again["partition"]["key"] == first["partition"]["key"]
    assert again["partition"]["build_id"] != first["partition"]["build_id"]
    assert victim.exists()


def test_force_reruns_the_named_stage(prefect_server: str, tiny: dict[str, Any]):
    first = run_flow(tiny)
    forced = run_flow(tiny, force=["features"])
    assert states(forced) == {"download": "Cached", "partition": "Cached", "features": "Completed"}
    assert forced["features"]["build_id"] != first["features"]["build_id"]


def test_a_rebuilt_unreproducible_partition_rebuilds_what_rests_on_it(prefect_server: str, tiny: dict[str, Any]):
    """KaMinPar on two threads cuts differently every run, under the same key: once the partition is rebuilt
    outside this flow, the features made from the old one are stale for `gnnpipe status`, the every-stage-cached
    shortcut and the flow (whose Prefect record of them has the same key) alike, and the next run rebuilds them."""
    from flows.cli import _all_cached
    from flows.cli_store import config_status, find_build
    from flows.cli_train import upstream_manifests
    from flows.config import STAGES as MODULES
    from flows.config import make_config

    cfg = {**tiny, "method": "kaminpar", "kaminpar_threads": 2}
    first = run_flow(cfg)
    pc, store = make_config(cfg, until="features"), ArtifactStore(cfg["artifacts"])
    part = store.load("partition", first["partition"]["key"])
    assert not part.reproducible
    assert store.load("features", first["features"]["key"]).upstream_builds == {"partition": part.build_id}
    assert _all_cached(pc, store) is not None

    rebuilt = MODULES["partition"].run(store, pc.stage_params("partition"),
                                       {"download": store.load("download", first["download"]["key"])}, force=True,
                                       progress=False)
    lines = {line.split()[0]: line for line in config_status(store, pc)}
    assert {name: line.split()[2] for name, line in lines.items()} == {"download": "cached", "partition": "cached",
                                                                     "features": "stale"}
    assert lines["features"].endswith("rests on another build of partition: a run rebuilds it")
    assert _all_cached(pc, store) is None
    sets = [f"{k}={json.dumps(v)}" for k, v in cfg.items() if k != "artifacts"]
    with pytest.raises(InputError, match=r"^features \w+ in .* rests on another build of partition than this "
                                         r"config's: rerun the pipeline"):
        find_build("features", None, None, sets, cfg["artifacts"])   # what `gnnpipe show/export --set` pick
    with pytest.raises(InputError, match=r"^features artifact \w+ rests on another build of partition in .*"
                                         r"`gnnpipe run --until hotness`"):
        upstream_manifests(pc, store)   # what `gnnpipe train` on each node of a multi-node job takes
    again = run_flow(cfg)
    assert states(again) == {"download": "Cached", "partition": "Cached", "features": "Completed"}
    assert again["features"]["key"] == first["features"]["key"]
    assert store.load("features", first["features"]["key"]).upstream_builds == {"partition": rebuilt.build_id}
    assert states(run_flow(cfg)) == dict.fromkeys(STAGES, "Cached")
    # its build deleted, the partition will be cut afresh: what was made from it is stale already
    store.remove("partition", part.key)
    status = {line.split()[0]: line.split()[2] for line in config_status(store, pc)}
    assert status == {"download": "cached", "partition": "missing", "features": "stale"}


def test_until_stops_early(prefect_server: str, tiny: dict[str, Any]):
    result = run_flow(tiny, until="partition")
    assert list(result) == ["download", "partition"]
    assert not (Path(tiny["artifacts"]) / "features").exists()


def test_num_partitions_above_num_nodes_fails_cleanly(prefect_server: str, tiny: dict[str, Any]):
    with pytest.raises(InputError, match=r"impossible combination: 5000 partitions of a 3000-node graph"):
        run_flow(tiny, num_partitions=5000)
    part_root = Path(tiny["artifacts"]) / "partition"
    assert not part_root.exists() or list(part_root.iterdir()) == []


def _cli(args: list[str], api_url: str | None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*GNNPIPE, *args], cwd=REPO, env=cli_env(api_url), capture_output=True, text=True,
                          timeout=timeout)


def _set_args(cfg: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in cfg.items():
        if k != "artifacts":
            out += ["--set", f"{k}={json.dumps(v)}"]
    return out + ["--artifacts", cfg["artifacts"]]


def _labels(output: str) -> dict[str, str]:
    """``stage -> label`` from the CLI's summary lines (``download   Cached     <key>  <headline>``)."""
    return {words[0]: words[1] for line in output.splitlines()
            if len(words := line.split()) >= 3 and words[0] in STAGES and words[1] in ("Completed", "Cached")}


def test_two_concurrent_runs_compute_each_stage_once(prefect_server: str, tiny: dict[str, Any]):
    """Each stage is built by one run; the other, which waited on the stage's lock and found the artifact, says
    Cached (it said Completed before [3/7]: it ran the task, which computed nothing)."""
    args = ["run", "--until", "features", *_set_args(tiny)]
    procs = [subprocess.Popen([*GNNPIPE, *args], cwd=REPO, env=cli_env(prefect_server), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    builds = ArtifactStore(tiny["artifacts"]).builds()
    assert sorted(b["stage"] for b in builds) == sorted(STAGES), builds
    labels = [_labels(out) for out in outputs]
    for stage in STAGES:
        assert sorted(run[stage] for run in labels) == ["Cached", "Completed"], (stage, outputs)


def test_runs_after_the_prefect_records_are_deleted_say_cached(prefect_server: str, tiny: dict[str, Any]):
    """Deleting ``<root>/.prefect`` loses Prefect's cache records, not the artifacts: the tasks run, find their
    artifacts in the store and compute nothing, so they are Cached (Completed before [3/7])."""
    import shutil

    first = run_flow(tiny)
    shutil.rmtree(Path(tiny["artifacts"]) / ".prefect")
    again = run_flow(tiny)
    assert states(again) == dict.fromkeys(STAGES, "Cached")
    assert {n: r["build_id"] for n, r in again.items()} == {n: r["build_id"] for n, r in first.items()}


@pytest.mark.parametrize("args, message", [
    (["--set", "dataset=nope"], "invalid parameter dataset='nope': unknown value; expected one of synthetic, "),
    (["--set", "num_partitions=0"], "invalid parameter num_partitions=0: Input should be greater than or equal to 1"),
    (["--set", "until=bogus"], "invalid parameter until: unknown stage 'bogus'"),
    (["--set", "no_such_key=1"], "invalid parameter no_such_key: unknown name"),
    (["--set", "split=[0.5,0.6,0.2]"], "split=(0.5, 0.6, 0.2) must be 3 fractions (train, valid, test)"),
    (["--set", "num_nodes=10"], "avg_degree=20.0 exceeds num_nodes - 1 = 9; lower avg_degree"),
])
def test_bad_parameters_give_one_line_errors(tmp_path: Path, args: list[str], message: str):
    """Every parameter is checked when the config loads, before a server or a stage starts: the split was checked
    inside the download task before [3/7], after 47 s of starting the temporary server."""
    with pytest.raises(InputError) as err:
        load_config(None, args[1::2], artifacts=str(tmp_path / "a"))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not (tmp_path / "a").exists()


# Two of them through `gnnpipe run` (a subprocess each cost ~4 CPU-seconds of start-up, for the same code path):
# the line, exit 2, no server started, nothing written
@pytest.mark.parametrize("args, message", [
    (["--set", "dataset=nope"], "invalid parameter dataset='nope': unknown value; expected one of synthetic, "),
    (["--set", "split=[0.5,0.6,0.2]"], "split=(0.5, 0.6, 0.2) must be 3 fractions (train, valid, test)"),
])
def test_run_stops_at_a_bad_parameter_before_any_server(tmp_path: Path, args: list[str], message: str):
    proc = _cli(["run", "--artifacts", str(tmp_path / "a"), *args], api_url=None, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]], proc.stderr
    assert proc.stderr.strip().startswith(f"error: {message}")
    assert "server" not in proc.stdout + proc.stderr
    assert not (tmp_path / "a").exists()


def test_unwritable_artifact_root(tmp_path: Path):
    (tmp_path / "file").write_text("")
    proc = _cli(["run", "--artifacts", str(tmp_path / "file" / "art")], api_url=None, timeout=60)
    assert proc.returncode == 2
    assert "not writable" in proc.stderr.strip().splitlines()[-1]


def test_corrupted_manifest_and_chunk_via_cli(prefect_server: str, tiny: dict[str, Any]):
    first = run_flow(tiny)
    # a corrupted manifest: `show` names the file; the next run rebuilds the stage
    manifest = Path(first["partition"]["uri"]) / "manifest.json"
    manifest.write_text("{broken")
    proc = _cli(["show", "partition", *_set_args(tiny)], api_url=None, timeout=60)
    assert proc.returncode == 2 and "corrupted manifest" in proc.stderr and str(manifest) in proc.stderr
    assert states(run_flow(tiny))["partition"] == "Completed"
    # a corrupted chunk (same size) of the features' source: rerunning features fails with a one-line error
    chunk = next(p for p in sorted((Path(first["download"]["uri"]) / "graph.zarr" / "x" / "node" / "c").rglob("*"))
                 if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    proc = _cli(["stage", "features", *_set_args(tiny)], api_url=prefect_server)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: corrupted chunk") and "graph.zarr/x" in last
    features_root = Path(tiny["artifacts"]) / "features"
    assert not [p for p in features_root.iterdir() if p.name.startswith(".tmp")]
    # the failed forced rebuild left the previous (valid) artifact as it was
    assert ArtifactStore(tiny["artifacts"]).find("features", first["features"]["key"]) is not None


def test_malformed_files_dataset_fails_cleanly(prefect_server: str, tmp_path: Path):
    import numpy as np

    data = tmp_path / "mygraph"
    data.mkdir()
    np.save(data / "edge_index.npy", np.array([[0, 1, 2], [1, 2, 7]]))  # node 7 does not exist
    np.save(data / "x.npy", np.zeros((4, 3), dtype=np.float32))
    np.save(data / "y.npy", np.array([0, 1, 0, 1]))
    for name, ids in (("train_idx", [0, 1]), ("valid_idx", [2]), ("test_idx", [3])):
        np.save(data / f"{name}.npy", np.array(ids))
    artifacts = tmp_path / "art"
    proc = _cli(["run", "--artifacts", str(artifacts), "--set", "dataset=files", "--set", f"path={data}"],
                api_url=prefect_server)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "edge_index.npy" in last
    # nothing of the failure is left: no empty stage directory, no record of the task's exception
    assert not (artifacts / "download").exists()
    assert list((artifacts / ".prefect" / "cache-keys").iterdir()) == []
    assert list((artifacts / ".prefect" / "results").iterdir()) == []
    # one line, not Prefect's four repeats with two tracebacks (116 lines before [3/7]); those go to errors.log
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and output.count("edge_index.npy") == 1, output


def _flow_run_logs(api_url: str) -> list[str]:
    """The messages the server holds for the latest flow run (Prefect's log, as its UI shows it)."""
    def post(path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(f"{api_url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)

    [run] = post("/flow_runs/filter", {"sort": "EXPECTED_START_TIME_DESC", "limit": 1})
    return [log["message"] for log in post("/logs/filter", {"logs": {"flow_run_id": {"any_": [run["id"]]}}})]


def test_a_stray_label_warns_on_the_terminal_and_in_the_prefect_log(prefect_server: str, tmp_path: Path):
    import numpy as np

    data = tmp_path / "mygraph"
    data.mkdir()
    np.save(data / "edge_index.npy", np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]))
    np.save(data / "x.npy", np.zeros((6, 3), dtype=np.float32))
    np.save(data / "y.npy", np.array([0, 1, 2, 1, 0, 10]))   # a stray 10 among classes 0-2
    for name, ids in (("train_idx", [0, 1, 2]), ("valid_idx", [3]), ("test_idx", [4, 5])):
        np.save(data / f"{name}.npy", np.array(ids))
    proc = _cli(["run", "--until", "download", "--artifacts", str(tmp_path / "art"), "--set", "dataset=files",
                 "--set", f"path={data}"], api_url=prefect_server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = "warning: y.npy: classes 3-9 have no labelled node; num_classes=11 because the largest label is 10"
    assert len([line for line in proc.stderr.splitlines() if said in line]) == 1, proc.stderr
    assert "11 classes" in proc.stdout
    assert len([m for m in _flow_run_logs(prefect_server) if m.startswith(said)]) == 1


def test_whole_pipeline_ends_with_a_trained_model(prefect_server: str, tiny: dict[str, Any]):
    # lr 0.02: two epochs at the default 0.003 stay near chance on this 4-class graph
    extra = {"fanouts": [5, 5], "batch_size": 64, "hidden": 16, "epochs": 2, "lr": 0.02, "until": "train"}
    first = run_flow(tiny, **extra)
    assert first["train"]["state"] == "Completed"
    manifest = ArtifactStore(tiny["artifacts"]).load("train", first["train"]["key"])
    assert 0.25 < TrainSummary.from_json(manifest.summary).test_metric <= 1.0
    assert "test accuracy" in first["train"]["headline"]
    assert {"model.pt", "metrics.json", "curves.png", "hit_rate.png"} <= set(manifest.files)
    # runtime settings (timeout, memory budget, device) reach the stage without changing its key
    again = run_flow(tiny, **extra, timeout_s=3600.0)
    assert again["train"] == {**first["train"], "state": "Cached"}


def test_runtime_settings_reach_the_task_but_not_the_cache_key():
    from flows.config import STAGES, make_config
    from flows.tasks import StageKey

    cfg = make_config(timeout_s=5, host_memory_budget_bytes=0, device="cpu", download_dir="/tmp/ogb")
    task_params = cfg.train.model_dump(mode="json")   # what the flow hands the train task
    assert task_params["timeout_s"] == 5 and task_params["host_memory_budget_bytes"] == 0
    assert STAGES["train"].Params(**task_params).device == "cpu"
    upstream = {"partition": "p", "features": "f", "hotness": "h"}
    key = StageKey(stage="train").compute_key(None, {"params": task_params, "upstream": upstream}, {})
    default = StageKey(stage="train").compute_key(
        None, {"params": make_config().train.model_dump(mode="json"), "upstream": upstream}, {})
    assert key == default
    other = StageKey(stage="train").compute_key(
        None, {"params": make_config(epochs=3).train.model_dump(mode="json"), "upstream": upstream}, {})
    assert other != default
    assert cfg.download.key_params() == make_config().download.key_params()
