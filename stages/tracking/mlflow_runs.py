"""MLflow runs of the train and infer builds, when ``MLFLOW_TRACKING_URI`` is set.

One run per train build, in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``gnnpipe``), named by the train key
and tagged with the artifact keys (``gnnpipe.<stage>_key``) and the build id (``gnnpipe.train_build``, which tells
two builds of one key apart, e.g. after ``--force train``). It holds the train parameters (the key's), the
per-epoch metrics (step = the 0-based epoch), the final figures, and ``model.pt``, ``metrics.json`` and the figures
as artifacts. ``mlflow.pytorch.log_model`` is not used: it pickles the module and infers pip requirements (tens of
seconds), while ``model.pt`` is the state_dict the README's loading code reads. The infer stage logs its scalars
and tags into the run of the train build it read (found by ``gnnpipe.train_build``; logged from the train
artifact first if that build has no run: trained before the URI was set, or while the server was down).

Everything is logged from published artifacts, after the stage published its own, through ``MlflowClient`` (no
active-run state in the process). A failing server never costs the artifact: the stage logs one ``warning:`` line
and returns it. A URI with an HTTP server that does not answer is found by one short probe, not after MLflow's
retries (7 with exponential backoff, minutes).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.tracking import epoch_scalars, final_scalars, flat_params
from storage import ArtifactStore, InputError, Manifest
from storage.infer_artifact import InferArtifact
from storage.train import CURVES_PNG, HIT_RATE_PNG, METRICS, MODEL, PHASES_PNG

if TYPE_CHECKING:
    from mlflow import MlflowClient

URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "gnnpipe"
TRAIN_BUILD_TAG = "gnnpipe.train_build"
PROBE_TIMEOUT_S = 10.0
_BATCH = 100   # MLflow takes at most 100 params or tags and 1000 metrics per log_batch
_PARAM_CHARS = 6000


def tracking_uri() -> str | None:
    return os.environ.get(URI_ENV) or None


def require_mlflow() -> None:
    """With ``MLFLOW_TRACKING_URI`` set, mlflow must be importable: checked before a stage starts its ranks."""
    uri = tracking_uri()
    if uri is None:
        return
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise InputError(f"{URI_ENV} is set ({uri}) but mlflow is not installed: pip install gnnpipe[tracking] "
                         f"(or unset {URI_ENV})") from None


def experiment_name() -> str:
    return os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT


def log_train(store: ArtifactStore, train: Manifest, log: Callable[[str], None]) -> str | None:
    """Log the published train build ``train`` as a new run; its id, or None (no URI, or a warning logged)."""
    return _guarded(f"train/{train.key}", log, lambda client: _log_train(client, store, train))


def log_infer(store: ArtifactStore, infer: Manifest, train: Manifest, log: Callable[[str], None]) -> str | None:
    """Add the published infer build's scalars to the run of ``train`` (creating it from the train artifact if it
    has none); the run's id, or None (no URI, or a warning logged)."""
    def body(client: MlflowClient) -> str:
        run_id = find_run(client, train)
        if run_id is None:
            log(f"MLflow: train/{train.key} has no run yet; logging it from its artifact")
            run_id = _log_train(client, store, train)
        artifact = InferArtifact(store, infer)
        metrics = artifact.metrics()
        now = _now_ms()
        _log_batch(client, run_id, metrics=[_metric(tag, value, now, 0) for tag, value in metrics["scalars"].items()],
                   tags={"gnnpipe.infer_key": infer.key, "gnnpipe.infer_artifact": infer.uri})
        with tempfile.TemporaryDirectory(prefix="gnnpipe-mlflow-") as tmp:
            path = Path(tmp, "metrics.json")
            path.write_text(json.dumps(metrics, indent=2, sort_keys=True))
            client.log_artifact(run_id, str(path), artifact_path=f"infer/{infer.key}")
        return run_id

    return _guarded(f"infer/{infer.key}", log, body)


def find_run(client: MlflowClient, train: Manifest) -> str | None:
    """The newest run of train build ``train`` in the experiment, if any."""
    experiment = client.get_experiment_by_name(experiment_name())
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TRAIN_BUILD_TAG}` = "
                                                                        f"'{train.build_id}'",
                              max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def _guarded(what: str, log: Callable[[str], None], body: Callable[[MlflowClient], str]) -> str | None:
    uri = tracking_uri()
    if uri is None:
        return None
    try:
        from mlflow import MlflowClient

        _probe(uri)
        client = MlflowClient(tracking_uri=uri)
        run_id = body(client)
        where = _run_url(uri, client, run_id)
    except Exception as err:  # noqa: BLE001 - the artifact is published: tracking must not fail the stage
        text = " ".join(str(err).split()) or type(err).__name__
        log(f"warning: MLflow logging of {what} to {uri} failed ({text[:300]}); the artifact is published "
            f"without it")
        return None
    log(f"MLflow: {what} logged to run {run_id} of experiment {experiment_name()}: {where}")
    return run_id


def _run_url(uri: str, client: MlflowClient, run_id: str) -> str:
    """The run's page on an HTTP server (MLflow's own URL form), else the tracking URI."""
    if not uri.startswith(("http://", "https://")):
        return uri
    experiment_id = client.get_run(run_id).info.experiment_id
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _terminate(client: MlflowClient, run_id: str, status: str) -> None:
    """``set_terminated`` without the two lines it prints on stdout (``_guarded`` logs the run's URL instead)."""
    with contextlib.redirect_stdout(io.StringIO()):
        client.set_terminated(run_id, status)


def _probe(uri: str) -> None:
    """An HTTP tracking server must answer at all (any status counts): MLflow's own retries take minutes."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return   # it answered
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ConnectionError(f"the tracking server does not answer: {reason}") from None


def _experiment_id(client: MlflowClient) -> str:
    name = experiment_name()
    for _ in range(2):   # two processes may create it at once: the loser finds the winner's
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(client.create_experiment(name))
        except Exception:  # noqa: BLE001 - RESOURCE_ALREADY_EXISTS: look it up again
            continue
    raise RuntimeError(f"could not create or find the MLflow experiment {name}")


def _log_train(client: MlflowClient, store: ArtifactStore, train: Manifest) -> str:
    metrics = json.loads(store.read_bytes("train", train.key, METRICS))
    tags = {"gnnpipe.stage": "train", "gnnpipe.train_key": train.key, TRAIN_BUILD_TAG: train.build_id,
            "gnnpipe.train_artifact": train.uri,
            **{f"gnnpipe.{name}_key": key for name, key in sorted(train.upstream.items())}}
    run = client.create_run(_experiment_id(client), run_name=train.key, tags=tags)
    run_id = str(run.info.run_id)
    try:
        now = _now_ms()
        per_epoch = [_metric(tag, value, now, step) for tag, step, value in epoch_scalars(metrics)]
        last = int(metrics["last_epoch"])
        final = [_metric(tag, value, now, last) for tag, value in final_scalars(metrics).items()]
        params = {name: str(value)[:_PARAM_CHARS] for name, value in flat_params(train.params).items()}
        _log_batch(client, run_id, metrics=per_epoch + final, params=params)
        with tempfile.TemporaryDirectory(prefix="gnnpipe-mlflow-") as tmp:
            optional = [name for name in (PHASES_PNG,) if name in train.files]   # none before the phase split
            for name in (MODEL, METRICS, CURVES_PNG, HIT_RATE_PNG, *optional):
                Path(tmp, name).write_bytes(store.read_bytes("train", train.key, name))
                client.log_artifact(run_id, str(Path(tmp, name)))
        _terminate(client, run_id, "FINISHED")
    except BaseException:
        _quietly(lambda: _terminate(client, run_id, "FAILED"))
        raise
    return run_id


def _log_batch(client: MlflowClient, run_id: str, *, metrics: Sequence[Any] = (),
               params: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> None:
    from mlflow.entities import Param, RunTag

    param_list = [Param(k, v) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
    for i in range(0, max(len(param_list), len(tag_list)), _BATCH):
        client.log_batch(run_id, params=param_list[i:i + _BATCH], tags=tag_list[i:i + _BATCH])
    for i in range(0, len(metrics), 10 * _BATCH):
        client.log_batch(run_id, metrics=list(metrics[i:i + 10 * _BATCH]))


def _metric(tag: str, value: float, timestamp_ms: int, step: int) -> Any:
    from mlflow.entities import Metric

    return Metric(tag, float(value), timestamp_ms, step)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - best effort while another error propagates
        pass
