"""Experiment tracking: the TensorBoard event files in the train and infer artifacts hold what metrics.json holds;
with ``MLFLOW_TRACKING_URI`` set, a real local MLflow server (sqlite backend, loopback port, stopped by PID) gets one
run per train build with the infer scalars added; a set URI without mlflow fails before any rank starts; a server
that does not answer costs a warning line, never the artifact."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flows.config import make_config
from stages.infer import stage as infer
from stages.infer.params import Params as InferParams
from stages.tracking import epoch_scalars, final_scalars, flat_params
from stages.tracking.mlflow_runs import TRAIN_BUILD_TAG, log_infer, log_train
from stages.train import stage as train
from storage import ArtifactStore, InputError, Manifest
from storage.infer_artifact import InferArtifact
from storage.phases import PHASES
from storage.tracking import event_file_name
from storage.train import CURVES_PNG, HIT_RATE_PNG, METRICS, MODEL, PHASES_PNG
from tests._infer_pipeline import GRAPH
from tests._train_pipeline import build_without_prefect
from tests.conftest import GNNPIPE, REPO, cli_env

tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                         reason="tensorboard is a gnnpipe dependency: reinstall gnnpipe")

VALUES: dict[str, Any] = {**{f"download.{k}": v for k, v in GRAPH.items()}, "num_partitions": 2, "fanouts": [5, 5],
                          "batch_size": 256, "hidden": 16, "epochs": 3, "lr": 0.01, "threads_per_rank": 1,
                          "timeout_s": 300.0, "peer_timeout_s": 60.0}
INFER = {"threads_per_rank": 1, "timeout_s": 300.0, "peer_timeout_s": 60.0}


# ---- a real MLflow server --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (uvicorn is its child), SIGKILL to what is left after 15 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """A local MLflow server's URI, or None where mlflow is not installed (the MLflow tests then skip)."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        yield None
        return
    base = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{_free_port()}"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}   # no background job workers
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(base / "server.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                 f"sqlite:///{base}/mlflow.db", "--artifacts-destination", str(base / "artifacts"),
                                 "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 180
        while not _healthy(uri):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the MLflow server did not start: {(base / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        _stop(proc)


def need(uri: str | None) -> str:
    if uri is None:
        pytest.skip("mlflow is not installed: pip install gnnpipe[tracking] (or .venv/bin/pip install mlflow)")
    return uri


# ---- one train and one infer build, tracked ---------------------------------------------------------------------
@dataclass
class Built:
    store: ArtifactStore
    manifests: dict[str, Manifest]
    train_lines: list[str]
    infer_lines: list[str]
    uri: str | None

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(json.loads(self.store.read_bytes("train", self.manifests["train"].key, METRICS)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str | None) -> Built:
    """download → ... → train (3 epochs, 2 ranks) → infer, with MLFLOW_TRACKING_URI set when a server runs."""
    root = str(tmp_path_factory.mktemp("art"))
    train_lines: list[str] = []
    infer_lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "gnnpipe-test")
        if mlflow_uri is not None:
            mp.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        store, manifests = build_without_prefect({**VALUES, "artifacts": root, "until": "hotness"})
        cfg = make_config({**VALUES, "artifacts": root, "until": "train"})
        manifests["train"] = train.run(store, cfg.train, {u: manifests[u] for u in train.UPSTREAM},
                                       progress=False, log=train_lines.append)
        manifests["infer"] = infer.run(store, InferParams(**INFER), {u: manifests[u] for u in infer.UPSTREAM},
                                       progress=False, log=infer_lines.append)
    return Built(store, manifests, train_lines, infer_lines, mlflow_uri)


def _accumulator(store: ArtifactStore, manifest: Manifest) -> Any:
    name = event_file_name(manifest.stage, manifest.key)
    assert name in manifest.files and manifest.files[name] > 0   # in the manifest like every file of the artifact
    acc = tb.EventAccumulator(str(Path(store.url(manifest.stage, manifest.key, name)).parent),
                              size_guidance={kind: 0 for kind in ("scalars", "images", "tensors")})
    acc.Reload()
    return acc


def _text(acc: Any, tag: str) -> str:
    return str(acc.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode())


def test_train_event_file_holds_metrics_json(built: Built):
    manifest, metrics = built.manifests["train"], built.metrics
    acc = _accumulator(built.store, manifest)
    expected: dict[str, list[tuple[int, float]]] = {}
    for tag, step, value in epoch_scalars(metrics):
        expected.setdefault(tag, []).append((step, value))
    assert {"train/loss", "train/train_metric", "train/val_metric", "train/lr", "train/epoch_s",
            "train/sampled_edges_per_s", "train/hit_rate", "train/remote_bytes"} <= set(expected)
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points] == list(range(len(metrics["epochs"]))), tag
        np.testing.assert_array_equal(np.array([v for _, v in got], dtype=np.float32),
                                      np.array([v for _, v in points], dtype=np.float32), tag)
    walls = [e.wall_time for e in acc.Scalars("train/loss")]
    assert walls == sorted(walls)   # spaced by the epochs' own durations
    final = final_scalars(metrics)
    assert set(final) >= {"train/test_metric", "train/test_metric_last", "train/best_epoch", "train/last_epoch"}
    for tag, value in final.items():
        [event] = acc.Scalars(tag)
        assert event.step == metrics["last_epoch"] and event.value == np.float32(value)
    assert {f"train/phase_s/{name}" for name in PHASES} <= set(expected)   # the slowest rank's split
    # the figures, byte for byte
    for tag, name in (("train/figures/curves", CURVES_PNG), ("train/figures/hit_rate", HIT_RATE_PNG),
                      ("train/figures/phases", PHASES_PNG)):
        [image] = acc.Images(tag)
        assert image.encoded_image_string == built.store.read_bytes("train", manifest.key, name)
        assert image.width > 100 and image.height > 100
    # parameters and keys: text, and the HParams session
    keys = _text(acc, "gnnpipe/artifacts")
    assert all(key in keys for key in [manifest.key, *manifest.upstream.values()])
    params = _text(acc, "gnnpipe/params")
    assert "| epochs | `3` |" in params and "| fanouts | `[5, 5]` |" in params
    assert acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.plugin_name == "hparams"


def test_train_hparams_session_holds_the_parameters(built: Built):
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = _accumulator(built.store, built.manifests["train"])
    data = plugin_data_pb2.HParamsPluginData.FromString(
        acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content)
    hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
               for k, v in data.session_start_info.hparams.items()}
    assert hparams["epochs"] == 3 and hparams["model"] == "auto" and hparams["fanouts"] == "[5, 5]"
    manifest = built.manifests["train"]
    keys = {"key.train": manifest.key, **{f"key.{name}": key for name, key in manifest.upstream.items()}}
    assert set(hparams) == set(manifest.params) | set(keys)
    assert {k: hparams[k] for k in keys} == keys


def test_infer_event_file_holds_its_scalars(built: Built):
    manifest = built.manifests["infer"]
    scalars = InferArtifact(built.store, manifest).metrics()["scalars"]
    assert "infer/acc_test" in scalars and "infer/job_wall_s" in scalars
    acc = _accumulator(built.store, manifest)
    assert set(acc.Tags()["scalars"]) == set(scalars)
    for tag, value in scalars.items():
        [event] = acc.Scalars(tag)
        assert event.step == 0 and event.value == np.float32(value)
    keys = _text(acc, "gnnpipe/artifacts")
    assert manifest.key in keys and built.manifests["train"].key in keys


def test_a_cached_stage_writes_and_logs_nothing_again(built: Built):
    cfg = make_config({**VALUES, "artifacts": built.store.root, "until": "train"})
    lines: list[str] = []
    again = train.run(built.store, cfg.train, {u: built.manifests[u] for u in train.UPSTREAM},
                      log=lines.append)
    assert again.build_id == built.manifests["train"].build_id and not lines


# ---- MLflow ------------------------------------------------------------------------------------------------------
def _client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _run_of(uri: str, train_manifest: Manifest, experiment: str = "gnnpipe-test") -> Any:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    [run] = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TRAIN_BUILD_TAG}` = "
                                                                  f"'{train_manifest.build_id}'")
    return run


def test_mlflow_run_of_the_train_build(built: Built, tmp_path: Path):
    uri = need(built.uri)
    manifest, metrics = built.manifests["train"], built.metrics
    run = _run_of(uri, manifest)
    assert run.info.run_name == manifest.key and run.info.status == "FINISHED"
    assert any(line.startswith(f"MLflow: train/{manifest.key} logged to run {run.info.run_id}")
               and f"{uri}/#/experiments/" in line for line in built.train_lines), built.train_lines
    tags = run.data.tags
    assert tags["gnnpipe.train_key"] == manifest.key and tags[TRAIN_BUILD_TAG] == manifest.build_id
    assert {tags[f"gnnpipe.{name}_key"] for name in train.UPSTREAM} == set(manifest.upstream.values())
    assert run.data.params == {k: str(v) for k, v in flat_params(manifest.params).items()}
    client = _client(uri)
    for tag, step_values in _by_tag(epoch_scalars(metrics)).items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        assert history == step_values, tag
    for tag, value in final_scalars(metrics).items():
        assert run.data.metrics[tag] == value
    names = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {MODEL, METRICS, CURVES_PNG, HIT_RATE_PNG, PHASES_PNG} <= names
    local = client.download_artifacts(run.info.run_id, MODEL, str(tmp_path))
    assert Path(local).read_bytes() == built.store.read_bytes("train", manifest.key, MODEL)


def _by_tag(points: Iterator[tuple[str, int, float]]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for tag, step, value in points:
        out.setdefault(tag, []).append((step, value))
    return out


def test_mlflow_infer_scalars_join_the_train_run(built: Built):
    uri = need(built.uri)
    run = _run_of(uri, built.manifests["train"])
    scalars = InferArtifact(built.store, built.manifests["infer"]).metrics()["scalars"]
    for tag, value in scalars.items():
        assert run.data.metrics[tag] == pytest.approx(value, rel=1e-12)
    assert run.data.tags["gnnpipe.infer_key"] == built.manifests["infer"].key
    assert any(f"MLflow: infer/{built.manifests['infer'].key} logged to run {run.info.run_id}" in line
               for line in built.infer_lines), built.infer_lines
    names = {f.path for f in _client(uri).list_artifacts(run.info.run_id, f"infer/{built.manifests['infer'].key}")}
    assert names == {f"infer/{built.manifests['infer'].key}/metrics.json"}


def test_mlflow_infer_logs_the_train_build_first_when_it_has_no_run(built: Built, monkeypatch: pytest.MonkeyPatch):
    """A train build made before the URI was set (or while the server was down) gets its run from its artifact."""
    uri = need(built.uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "gnnpipe-backfill")
    lines: list[str] = []
    run_id = log_infer(built.store, built.manifests["infer"], built.manifests["train"], lines.append)
    assert run_id is not None and lines[0].startswith(f"MLflow: train/{built.manifests['train'].key} has no run")
    run = _run_of(uri, built.manifests["train"], "gnnpipe-backfill")
    assert run.info.run_id == run_id
    assert "train/test_metric" in run.data.metrics and "infer/acc_test" in run.data.metrics


def test_a_server_that_does_not_answer_costs_a_warning_not_the_artifact(built: Built,
                                                                        monkeypatch: pytest.MonkeyPatch):
    need(built.uri)
    dead = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    lines: list[str] = []
    start = time.monotonic()
    assert log_train(built.store, built.manifests["train"], lines.append) is None
    assert time.monotonic() - start < 10, "one probe, not MLflow's minutes of retries"
    [line] = lines
    assert line.startswith(f"warning: MLflow logging of train/{built.manifests['train'].key} to {dead} failed")
    assert line.endswith("the artifact is published without it")
    # the stage: a new infer build (sampled) is published, with its event file, and says why MLflow has nothing
    lines = []
    manifest = infer.run(built.store, InferParams(**INFER, fanouts=[3, 3]),
                         {u: built.manifests[u] for u in infer.UPSTREAM}, progress=False, log=lines.append)
    assert built.store.find("infer", manifest.key) == manifest
    assert event_file_name("infer", manifest.key) in manifest.files
    [line] = [ln for ln in lines if "MLflow" in ln]
    assert line.startswith(f"warning: MLflow logging of infer/{manifest.key} to {dead} failed")


# ---- a set URI without mlflow ------------------------------------------------------------------------------------
def test_a_set_uri_without_mlflow_fails_before_any_rank_starts(built: Built, monkeypatch: pytest.MonkeyPatch):
    import stages.jobs.launcher as launcher

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setitem(sys.modules, "mlflow", None)   # import mlflow raises ImportError

    def no_launch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a rank was launched")

    monkeypatch.setattr(launcher, "launch", no_launch)
    cfg = make_config({**VALUES, "artifacts": built.store.root, "until": "train", "epochs": 2})   # a new key
    with pytest.raises(InputError, match=r"MLFLOW_TRACKING_URI is set \(http://127.0.0.1:1\) but mlflow is not "
                                         r"installed: pip install gnnpipe\[tracking\]"):
        train.run(built.store, cfg.train, {u: built.manifests[u] for u in train.UPSTREAM})
    with pytest.raises(InputError, match=r"pip install gnnpipe\[tracking\]"):
        infer.run(built.store, InferParams(**INFER, embeddings="all"), {u: built.manifests[u] for u in infer.UPSTREAM})
    # cached builds log nothing, so they need nothing
    same = make_config({**VALUES, "artifacts": built.store.root, "until": "train"})
    assert train.run(built.store, same.train,
                     {u: built.manifests[u] for u in train.UPSTREAM}) == built.manifests["train"]


def test_the_cli_says_it_in_one_error_line(built: Built, tmp_path: Path):
    """``gnnpipe train`` with the URI set and mlflow not importable (a stub package that raises ImportError)."""
    stub = tmp_path / "stub" / "mlflow"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('not installed (test stub)')\n")
    env = {**cli_env(), "MLFLOW_TRACKING_URI": "http://127.0.0.1:1",
           "PYTHONPATH": os.pathsep.join([str(stub.parent), str(REPO)])}
    sets = [a for k, v in {**VALUES, "epochs": 2}.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    proc = subprocess.run([*GNNPIPE, "train", "--artifacts", built.store.root, *sets], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line == ("error: MLFLOW_TRACKING_URI is set (http://127.0.0.1:1) but mlflow is not installed: pip "
                    "install gnnpipe[tracking] (or unset MLFLOW_TRACKING_URI)")
