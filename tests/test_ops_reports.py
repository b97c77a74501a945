"""What the train report and the error messages tell a person (issue 12, item 7), unit-level: no ranks, no server.

What broke:
a. an empty valid or test split was reported as "0.00 %" accuracy (``NodeClassification.metric`` returned 0.0 for
   no seeds), and best-validation selection compared those zeros;
b. a 1-class dataset trained and scored 100 %;
c. the log said "resuming from the checkpoint after epoch 1" (0-based) where the report said "after epoch 2";
d. a checksum error said "rerun the stage that wrote it with --force" without naming the stage;
e. torchrun's group killed from outside gave "torchrun exited with code 1 before naming a rank".
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from stages.download import stage as download
from stages.download.files_source import load_files
from stages.jobs.errors import TrainingError
from stages.jobs.launcher import failure_message, launch
from stages.train import stage as train
from stages.train.rank import trainer as trainer_module
from stages.train.rank.recipe import BestModel
from stages.train.rank.stats import EpochStats
from stages.train.tasks import NodeClassification
from storage import ArtifactError, ArtifactStore, InputError, Manifest
from storage.train import torchrun_log_dir
from storage.zarr_io import open_group, read_array, rerun_hint, write_array
from tests._download_cases import write_dataset

# ---- a. an empty split has no accuracy -------------------------------------------------------------------------


def test_accuracy_over_an_empty_split_is_nan_not_zero():
    task = NodeClassification(lambda gid: gid, {"train": torch.arange(3)})
    assert math.isnan(task.metric([0.0, 0.0]))
    assert task.metric([3.0, 4.0]) == 0.75


def test_without_validation_the_last_epoch_is_selected_and_patience_never_stops():
    """Before: every epoch's validation accuracy was 0.0, so epoch 1's model was published (and patience stopped)."""
    no_valid = NodeClassification(lambda gid: gid, {"valid": torch.arange(0)}).metric([0.0, 0.0])
    model = torch.nn.Linear(2, 2)
    best = BestModel(patience=1)
    for epoch in range(4):
        with torch.no_grad():
            model.weight.fill_(epoch)
        assert best.update(epoch, no_valid, model)
        assert not best.should_stop(epoch)
    assert best.epoch == 3 and best.state is not None and float(best.state["weight"][0, 0]) == 3.0
    # with validation, unchanged: the earliest best wins, patience counts from it
    best = BestModel(patience=1)
    assert best.update(0, 0.5, model) and not best.update(1, 0.5, model) and best.should_stop(1)


def _stats(val_metric: float) -> EpochStats:
    return EpochStats(epoch=0, loss=1.0, train_metric=0.5, val_metric=val_metric, lr=0.01, epoch_s=1.0, eval_s=0.1,
                      train_items=30, batches=3, sampled_edges=1_000_000, sampled_edges_per_s=1e6, hit_rate=0.5,
                      requested_rows=10, cached_rows=5, local_rows=3, remote_rows=2, cached_bytes=20, local_bytes=12,
                      remote_bytes=8)


def test_an_empty_validation_split_is_null_in_metrics_json_and_n_a_in_the_log():
    record = _stats(math.nan).as_dict()
    assert record["val_metric"] is None and json.loads(json.dumps(record))["val_metric"] is None
    assert "val n/a |" in _stats(math.nan).log_line(5) and "val 25.0 % |" in _stats(0.25).log_line(5)


ZERO = re.compile(r"(?<![\d.])0\.00 %")   # "0.00 %", not the end of "70.00 %"


def _summary(**over: Any) -> dict[str, Any]:
    epoch = {"epoch": 0, "loss": 1.0, "train_metric": 0.5, "val_metric": None, "lr": 0.01, "epoch_s": 1.0,
             "sampled_edges_per_s": 1e6, "hit_rate": 0.5, "cached_rows": 5, "local_rows": 3, "remote_rows": 2,
             "remote_bytes": 8}
    summary = {"metric_name": "accuracy", "test_metric": 0.75, "test_metric_last": 0.75, "best_val_metric": None,
               "best_epoch": 1, "last_epoch": 1, "final_val_metric": None, "stopped_early": False,
               "task": {"name": "node classification", "evaluator": "accuracy (OGB Evaluator acc)"},
               "recipe": {"loss": "cross_entropy", "lr": 0.01, "weight_decay": 0.0, "lr_schedule": "constant",
                          "patience": None},
               "num_partitions": 1, "world_size": 1, "nodes": 1,
               "model": {"kind": "sage", "kwargs": {}, "in_channels": 16, "hidden": 32, "out_channels": 4,
                         "num_layers": 2, "whole_batch": False, "parameters": 1234},
               "cache_policy": "none", "device": "cpu", "backend": "gloo", "resumed_from_epoch": None,
               "ranks": [{"rank": 0}], "mean_epoch_s": 1.0, "mean_hit_rate": 0.5, "remote_bytes_per_epoch": 8.0,
               "epochs": [epoch, {**epoch, "epoch": 1}]}
    return {**summary, **over}


def _manifest(summary: dict[str, Any]) -> Manifest:
    return Manifest(stage="train", version=train.VERSION, key="0123456789abcdef", params={}, upstream={},
                    created="2024-01-01T00:00:00+00:00", files={}, bytes=0, summary=summary, libraries={}, uri="x",
                    build_id="b")


def test_the_report_says_n_a_for_an_empty_split_never_zero_percent():
    no_valid = train.report(_manifest(_summary()))
    assert "test accuracy 75.00 % (no validation split: the last epoch's model, epoch 2)" in no_valid.headline
    assert not ZERO.search(no_valid.markdown) and all(row["val_accuracy"] == "n/a" for row in no_valid.table)
    assert "the published model is the last epoch's" in no_valid.markdown
    no_test = train.report(_manifest(_summary(test_metric=None, test_metric_last=None, best_val_metric=0.7)))
    assert ("test accuracy n/a at the best validation epoch 2 (val 70.00 %); last epoch 2: test n/a"
            in no_test.headline), no_test.headline
    assert not ZERO.search(no_test.markdown)


def test_a_summary_of_train_version_5_reports_alike():
    """Builds before the task-neutral keys stored test_acc & co. (and train_acc / val_acc per epoch)."""
    new = _summary(best_val_metric=0.7, final_val_metric=0.7)
    old_keys = {"test_metric": "test_acc", "test_metric_last": "test_acc_last", "best_val_metric": "best_val_acc",
                "final_val_metric": "final_val_acc"}
    old = {old_keys.get(k, k): v for k, v in new.items() if k != "metric_name"}
    old["epochs"] = [{{"train_metric": "train_acc", "val_metric": "val_acc"}.get(k, k): v for k, v in e.items()}
                     for e in new["epochs"]]
    assert "test_acc" in old and "val_acc" in old["epochs"][0]
    got, want = train.report(_manifest(old)), train.report(_manifest(new))
    assert (got.headline, got.table, got.markdown) == (want.headline, want.table, want.markdown)


# ---- b. one class --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("meta", [None, {"num_classes": 3}])
def test_a_one_class_files_dataset_is_refused_in_one_line(tmp_path: Path, meta: dict | None):
    d = write_dataset(tmp_path / "g", meta=meta)
    np.save(d / "y.npy", np.array([1, 1, 1, 1, 1, -1]))
    with pytest.raises(InputError) as err:
        load_files(str(d))
    assert str(err.value) == (f"y.npy in {d} has 1 class (every labelled node has label 1); node classification "
                              f"needs at least 2: label nodes of another class")
    # through the stage: refused before anything is written
    store = ArtifactStore(tmp_path / "art")
    with pytest.raises(InputError, match="has 1 class"):
        download.run(store, download.Params(dataset="files", path=str(d)), {}, progress=False)
    assert not (tmp_path / "art" / "download").exists()


def test_the_synthetic_and_ogb_sources_are_checked_too(monkeypatch):
    one_class = SimpleNamespace(x=np.zeros((4, 2), np.float32), y=np.zeros(4, np.int64), num_classes=1)
    monkeypatch.setattr("stages.download.ogb_source.load_ogb", lambda *a, **k: one_class)
    with pytest.raises(InputError, match="^dataset ogbn-arxiv has 1 class"):
        download.load(download.Params(dataset="ogbn-arxiv"), download_dir="unused", progress=False)


# ---- c. resume messages --------------------------------------------------------------------------------------


def test_the_resume_log_and_the_report_count_epochs_alike(monkeypatch, capsys):
    """The checkpoint taken after epoch index 1 (the second epoch): both say "epoch 2"."""
    monkeypatch.setattr(trainer_module, "resume_state", lambda *a, **k: {"epoch": 1})
    fake = SimpleNamespace(spec=SimpleNamespace(checkpoint_dir="unused", key="k"), rank=0, world=1, local_rank=0,
                           params=SimpleNamespace(epochs=8), epoch=-1, embeddings={})
    fake.load_state_dict = lambda state, part=None: setattr(fake, "epoch", state["epoch"])
    assert trainer_module.Trainer.resume(fake) == 1   # type: ignore[arg-type]
    logged = capsys.readouterr().out
    assert "resuming from the checkpoint after epoch 2/8" in logged, logged
    report = train.report(_manifest(_summary(resumed_from_epoch=1, best_val_metric=0.5)))
    assert "Resumed from the checkpoint after epoch 2." in report.markdown


# ---- d. a checksum error names the stage and the command ----------------------------------------------------


def test_a_corrupted_chunk_names_the_stage_to_rerun(tmp_path: Path):
    store = ArtifactStore(tmp_path)

    def body(writer):
        write_array(open_group(writer.file_url("features.zarr"), mode="w"), "x", np.arange(64, dtype=np.float32))

    manifest = store.build("features", 1, {}, {}, body)
    chunk = next(p for p in (tmp_path / "features" / manifest.key / "features.zarr" / "x").rglob("*")
                 if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF   # same size: the manifest's check passes, the checksum does not
    chunk.write_bytes(bytes(data))
    group = open_group(store.url("features", manifest.key, "features.zarr"))
    with pytest.raises(ArtifactError) as err:
        read_array(group, "x")
    assert str(err.value).startswith(f"corrupted chunk in file://{tmp_path}/features/{manifest.key}/features.zarr/x")
    assert str(err.value).endswith("; rerun the features stage to rebuild it: `gnnpipe run --force features` (or "
                                   "`gnnpipe stage features`) with the run's --config/--set"), str(err.value)
    assert rerun_hint("s3://bucket/root/hotness/0123456789abcdef/plan.zarr/part-0").startswith("rerun the hotness")
    assert rerun_hint("/somewhere/else.zarr") == "rerun, with --force <stage>, the stage whose artifact holds it"


# ---- e. torchrun's group signalled from outside ---------------------------------------------------------------

# What torchrun 2.13 printed when its process group got SIGTERM (`kill -TERM -<pgid>`) while two ranks ran.
TORCHRUN_SIGTERM = """\
W1124 06:25:13.020000 31848 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
W1124 06:25:13.021000 31848 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 31853 closing signal SIGTERM
Traceback (most recent call last):
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 31848 got signal: 15
"""  # noqa: E501 - torchrun's lines as they are

SIGNALLED = ("training was stopped by a signal: torchrun received {sig} from outside gnnpipe (a scheduler, `kill`, the "
             "OOM killer) and its ranks were stopped; the checkpoints were kept: rerun to resume")


@pytest.mark.parametrize("output", [TORCHRUN_SIGTERM, "Received Signals.SIGTERM death signal, shutting down workers\n"])
def test_torchrun_stopped_by_a_signal_is_named(tmp_path: Path, output: str):
    job = f"import sys; sys.stdout.write({output!r}); sys.exit(1)"
    with pytest.raises(TrainingError) as err:
        launch("unused", 2, result_dir=str(tmp_path), log=lambda line: None, timeout_s=60,
               command=[sys.executable, "-c", job])
    assert str(err.value) == SIGNALLED.format(sig="SIGTERM")


def test_torchrun_killed_by_a_signal_is_named():
    assert str(failure_message([], {}, -signal.SIGKILL)) == SIGNALLED.format(sig="SIGKILL")


SLEEPER = "import time\nprint('rank up', flush=True)\ntime.sleep(60)\n"


def test_a_real_torchrun_group_killed_from_outside(tmp_path: Path):
    """torchrun and its rank, signalled as `kill -TERM -<pgid>` (Slurm, systemd, docker stop) would."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    logs = torchrun_log_dir(tmp_path)   # as the launcher's own torchrun command has it (else a $TMPDIR folder stays)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               "--max-restarts=0", "--monitor-interval=0.5", f"--log-dir={logs}", str(script)]
    lines: list[str] = []

    def kill_when_up() -> None:
        deadline = time.monotonic() + 50
        while not any("rank up" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = next(int(line.split()[2]) for line in lines if line.startswith("[launcher] pid "))
        os.killpg(pid, signal.SIGTERM)

    killer = threading.Thread(target=kill_when_up, daemon=True)
    killer.start()
    with pytest.raises(TrainingError) as err:
        launch("unused", 1, result_dir=str(tmp_path), log=lines.append, timeout_s=120, command=command)
    killer.join(5)
    assert str(err.value) == SIGNALLED.format(sig="SIGTERM"), lines
    assert not logs.exists()   # removed with the job, however it ended
