"""``storage.train_summary.TrainSummary``: the task-neutral reading of the train stage's stored metrics."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from stages.infer.node import sampled_accuracy
from storage.train_summary import TrainSummary, epoch_metric

# a metrics.json of train VERSION 5 and before (accuracy-named keys; task=link kept its MRR under them)
OLD_METRICS: dict[str, Any] = {
    "epochs": [{"epoch": 0, "loss": 1.2, "train_acc": 0.4, "val_acc": 0.5},
               {"epoch": 1, "loss": 0.9, "train_acc": 0.6, "val_acc": 0.7}],
    "test_acc": 0.65, "test_acc_last": 0.64, "best_val_acc": 0.7, "best_epoch": 1, "last_epoch": 1,
    "final_val_acc": 0.7, "stopped_early": False,
    "task": {"name": "link", "evaluator": None, "metric": "mrr"}, "test_metrics": {"mrr": 0.65},
    "recipe": {"loss": "bce", "lr": 0.01}, "model": {"kind": "sage"}, "world_size": 2, "cache_policy": "none",
}


def test_old_keys_read_under_neutral_names() -> None:
    s = TrainSummary.from_json(OLD_METRICS)
    assert (s.metric_name, s.test_metric, s.test_metric_last) == ("mrr", 0.65, 0.64)
    assert (s.best_val_metric, s.final_val_metric, s.best_epoch, s.last_epoch) == (0.7, 0.7, 1, 1)
    assert s.extra == {"recipe": {"loss": "bce", "lr": 0.01}, "world_size": 2, "cache_policy": "none"}
    assert epoch_metric(s.best_epoch_record(), "train_metric") == 0.6


def test_neutral_keys_read_too() -> None:
    new = {"metric_name": "accuracy", "test_metric": 0.8, "best_val_metric": None, "final_val_metric": 0.3,
           "epochs": [{"epoch": 0, "train_metric": 0.9, "val_metric": 0.3}], "other": 1}
    s = TrainSummary.from_json(new)
    assert (s.metric_name, s.test_metric, s.best_val_metric, s.final_val_metric) == ("accuracy", 0.8, None, 0.3)
    assert epoch_metric(s.epochs[0], "val_metric") == 0.3 and s.extra == {"other": 1}


def test_an_older_summary_is_written_back_under_the_neutral_keys() -> None:
    out = TrainSummary.from_json(OLD_METRICS).to_json()
    assert not {"test_acc", "test_acc_last", "best_val_acc", "final_val_acc"} & set(out)
    assert (out["metric_name"], out["test_metric"], out["best_val_metric"]) == ("mrr", 0.65, 0.7)
    assert out["epochs"] == OLD_METRICS["epochs"] and out["recipe"] == OLD_METRICS["recipe"]


def test_round_trip_keeps_the_stored_form() -> None:
    stored = TrainSummary.from_json(OLD_METRICS).to_json()   # the form train VERSION 6 writes
    assert TrainSummary.from_json(stored).to_json() == stored
    assert TrainSummary.from_json(stored) == TrainSummary.from_json(OLD_METRICS)


def test_the_train_stage_writes_what_the_record_writes() -> None:
    """metrics.json's metric keys are the record's (the trainer writes them, the record reads them back)."""
    from stages.train.rank.stats import EpochStats
    from storage.train_summary import EPOCH_KEYS, OLD_KEYS

    assert set(EPOCH_KEYS) <= {f.name for f in fields(EpochStats)}
    assert not set(EPOCH_KEYS.values()) & {f.name for f in fields(EpochStats)}
    assert set(OLD_KEYS) <= set(TrainSummary.from_json({}).to_json())


def test_infer_reads_train_metrics_through_the_record() -> None:
    assert sampled_accuracy(OLD_METRICS) == {"train": 0.6, "valid": 0.7, "test": 0.65}
    assert sampled_accuracy({}) == {"train": None, "valid": None, "test": None}


def test_the_run_facts_read_typed_and_stay_as_stored() -> None:
    """The report's run facts (world size, nodes, ranks, recipe, per-epoch means) read through the record, with
    the defaults of a build that lacks them, and ``to_json`` keeps them exactly as stored."""
    stored = {**OLD_METRICS, "nodes": 2, "resumed_from_epoch": 3, "device": "cuda:0", "backend": "nccl",
              "ranks": [{"rank": 0, "host_gather": "uva"}], "mean_epoch_s": 1.5, "mean_hit_rate": 0.25,
              "remote_bytes_per_epoch": 2048.0}
    s = TrainSummary.from_json(stored)
    assert (s.world_size, s.nodes, s.resumed_from_epoch, s.device, s.backend) == (2, 2, 3, "cuda:0", "nccl")
    assert (s.cache_policy, s.recipe, s.ranks) == ("none", {"loss": "bce", "lr": 0.01}, stored["ranks"])
    assert (s.mean_epoch_s, s.mean_hit_rate, s.remote_bytes_per_epoch) == (1.5, 0.25, 2048.0)
    assert {k: v for k, v in s.to_json().items() if k in s.extra} == s.extra
    bare = TrainSummary.from_json({})
    assert (bare.world_size, bare.nodes, bare.resumed_from_epoch, bare.ranks, bare.mean_epoch_s) == (1, 1, None, [],
                                                                                                     0.0)
