"""The training recipe and plug-ins end to end, torchrun with gloo ranks on the CPU (the graph of
``tests._train_pipeline``: 8 000 nodes, 4 classes, chance 0.25, GraphSAGE 0.83 test accuracy).

- best-validation model selection with a step schedule and early stopping, killed after the best epoch and resumed:
  the same metrics and the same published weights as an uninterrupted run, and those weights are the best epoch's;
- the example plug-in model and loss (``examples/custom_model.py``) trained through the pipeline on 2 partitions;
- a NaN loss on one rank: one line naming epoch and rank, nothing published.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from stages.jobs.errors import TrainingError
from stages.train import stage as train
from stages.train.rank.faults import FAULT_ENV
from storage import ArtifactStore, InputError
from storage.manifest import stage_key
from storage.train import MODEL, checkpoint_dir
from storage.train_summary import TrainSummary
from tests._train_pipeline import (
    BATCH_SIZE,
    FANOUTS,
    GRAPH,
    TrainRun,
    build_upstream,
    build_without_prefect,
    train_params,
    train_upstream,
)

pytestmark = pytest.mark.slow
# lr 0.03 with a halving every 2 epochs: validation peaks within the first 8 epochs and patience 2 then stops
RECIPE = {"epochs": 16, "lr": 0.03, "weight_decay": 5e-4, "lr_schedule": "step", "lr_step_epochs": 2, "lr_gamma": 0.5,
          "patience": 2}


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    return ArtifactStore(tmp_path_factory.mktemp("art"))


@pytest.fixture(scope="module")
def two(art: ArtifactStore):
    return build_upstream(art, 2)


def _copy_upstream(run: TrainRun, root: Path) -> ArtifactStore:
    """A second artifact root with the same upstream artifacts (same keys), and no train artifact yet."""
    for stage in train.UPSTREAM:
        key = run.upstream[stage].key
        shutil.copytree(Path(run.store.url(stage, key)), root / stage / key)
    return ArtifactStore(root)


def test_best_epoch_early_stop_and_schedule_resume_exactly(art, two, tmp_path, monkeypatch):
    params, upstream = train_params(**RECIPE), train_upstream(two)
    ref = TrainRun(art, params, upstream)
    m, s = ref.metrics, ref.manifest.summary
    vals = [e["val_metric"] for e in m["epochs"]]
    assert m["best_epoch"] == vals.index(max(vals)) and m["best_val_metric"] == max(vals)
    assert m["stopped_early"] and m["last_epoch"] == m["best_epoch"] + 2 == len(vals) - 1 < 15, m["best_epoch"]
    assert [e["lr"] for e in m["epochs"]] == pytest.approx([0.03 * 0.5 ** (e // 2) for e in range(len(vals))])
    assert m["recipe"] == {"loss": "cross_entropy", "lr": 0.03, "weight_decay": 5e-4, "lr_schedule": "step",
                           "patience": 2}
    t = TrainSummary.from_json(s)
    assert t.test_metric >= 0.75 and t.test_metric_last >= 0.7, s
    assert f"early stop after epoch {len(vals)}" in ref.text()
    headline = train.report(ref.manifest).headline
    assert (f"test accuracy {100 * t.test_metric:.2f} % at the best validation epoch {m['best_epoch'] + 1}" in headline
            and f"last epoch {len(vals)}: test {100 * t.test_metric_last:.2f} %" in headline), headline

    # the published weights are the best epoch's: a run that ends at that epoch (the same streams and schedule up
    # to there, no stop) publishes the same bytes
    short = TrainRun(art, train_params(**{**RECIPE, "epochs": m["best_epoch"] + 1}), upstream)
    assert short.metrics["best_epoch"] == short.metrics["last_epoch"] == m["best_epoch"]
    assert [e["loss"] for e in short.metrics["epochs"]] == [e["loss"] for e in m["epochs"][:m["best_epoch"] + 1]]
    assert all(torch.equal(short.state[k], ref.state[k]) for k in ref.state)

    # killed in the last epoch, after the best one: the rerun resumes the best weights, the schedule and the count
    other = _copy_upstream(ref, tmp_path / "art")
    key = stage_key(train.NAME, train.VERSION, params.key_params(), {n: v.key for n, v in upstream.items()})
    monkeypatch.setenv(FAULT_ENV, f"1:{m['last_epoch']}:1")
    with pytest.raises(TrainingError, match="rank 1 was killed by SIGKILL"):
        train.run(other, params, upstream, log=lambda line: None)
    assert other.find(train.NAME, key) is None and checkpoint_dir(other, key).exists()
    monkeypatch.delenv(FAULT_ENV)
    resumed = TrainRun(other, params, upstream)
    assert resumed.metrics["resumed_from_epoch"] == m["last_epoch"] - 1
    timings = ("epoch_s", "eval_s", "sampled_edges_per_s", "phases_s", "prefetch_phases_s")
    assert resumed.metrics["epochs"] == [{**e, **{k: resumed.metrics["epochs"][i][k] for k in timings}}
                                         for i, e in enumerate(m["epochs"])], "every metric but the timings"
    for field in ("test_metric", "test_metric_last", "best_epoch", "best_val_metric", "last_epoch", "stopped_early"):
        assert resumed.metrics[field] == m[field], field
    assert all(torch.equal(resumed.state[k], ref.state[k]) for k in ref.state)


def test_the_example_model_and_loss_train_through_the_pipeline(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gnnpipe.train")
    cfg = {**{f"download.{k}": v for k, v in GRAPH.items()}, "artifacts": str(tmp_path / "art"), "num_partitions": 2,
           "fanouts": FANOUTS, "batch_size": BATCH_SIZE, "model": "examples.custom_model:build",
           "model_kwargs": {"aggr": "max"}, "loss": "examples.custom_model:smoothed_cross_entropy", "hidden": 32,
           "epochs": 6, "lr": 0.01, "dropout": 0.3, "threads_per_rank": 1, "timeout_s": 300.0,
           "peer_timeout_s": 60.0, "until": "train"}
    store, manifests = build_without_prefect(cfg)
    s = manifests["train"].summary
    # chance 0.25; built-in GraphSAGE 0.83
    assert s["world_size"] == 2 and TrainSummary.from_json(s).test_metric >= 0.7, s
    assert s["model"]["kind"] == "examples.custom_model:build" and s["model"]["kwargs"] == {"aggr": "max"}
    assert s["model"]["whole_batch"] and s["recipe"]["loss"] == "examples.custom_model:smoothed_cross_entropy"
    said = [r.getMessage() for r in caplog.records if "does not follow the block protocol" in r.getMessage()]
    assert len(said) == 1, said
    from examples.custom_model import build

    model = build(in_channels=16, hidden=32, out_channels=4, num_layers=2, dropout=0.3, aggr="max")
    model.load_state_dict(torch.load(Path(store.url("train", manifests["train"].key, MODEL)), weights_only=True))


def test_a_nan_loss_stops_the_job_with_one_line_and_publishes_nothing(art, two):
    params = train_params(loss="tests._plugins:nan_on_rank_1", epochs=3)
    upstream = train_upstream(two)
    lines: list[str] = []
    with pytest.raises(InputError) as err:
        train.run(art, params, upstream, log=lines.append)
    assert str(err.value).startswith("rank 1: the loss is nan at epoch 1, batch 3: training stopped on every rank "
                                     "and nothing was published"), str(err.value)
    assert "\n" not in str(err.value)
    assert [line for line in lines if "error:" in line] == [f"[rank 1] error: {str(err.value)[len('rank 1: '):]}"]
    assert not [line for line in lines if line.startswith("[rank") and "Traceback" in line], "no rank's traceback"
    key = stage_key(train.NAME, train.VERSION, params.key_params(), {n: v.key for n, v in upstream.items()})
    assert art.find(train.NAME, key) is None
