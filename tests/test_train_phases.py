"""Where the time goes (issue [4/5] item 5), the reading side, unit-level (no ranks): the epoch means of the phase
splits, the stacked bar figure, the train report's section and image, the tracker scalars; and a build without
phases (before the split) shows none of them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from stages.tracking import epoch_scalars
from stages.train import stage as train
from stages.train.plot import phases_png
from storage import ArtifactStore, Manifest
from storage.phases import PHASE_LABELS, PHASES, epochs_label, mean_phases
from storage.tracking import event_file_name
from storage.train import PHASES_PNG
from storage.train_summary import TrainSummary

PNG = b"\x89PNG"
# the producer thread's only non-zero phases (its wait: idle, ahead of the model)
PREFETCH_PHASES = ("sample", "gather_remote", "exchange", "wait", "other")


def _split(epoch: int, rank: int, phase: int) -> float:
    """Rank 1 twice as slow as rank 0; epoch 0 one second more per phase (the warm-up the means leave out)."""
    return 0.1 * (phase + 1) * (rank + 1) + (1.0 if epoch == 0 else 0.0) + 0.01 * epoch


def _epochs(n: int = 3, *, phases: bool = True, prefetch: bool = True) -> list[dict[str, Any]]:
    out = []
    for e in range(n):
        record: dict[str, Any] = {"epoch": e, "loss": 1.0 - 0.1 * e, "train_metric": 0.5, "val_metric": 0.6,
                                  "lr": 0.01, "epoch_s": 6.0, "eval_s": 0.5, "sampled_edges_per_s": 1e6,
                                  "hit_rate": 0.4, "cached_rows": 4, "local_rows": 3, "remote_rows": 3,
                                  "remote_bytes": 192}
        if phases:
            record["phases_s"] = {p: [_split(e, r, i) for r in range(2)] for i, p in enumerate(PHASES)}
            record["prefetch_phases_s"] = ({p: [0.05 * (r + 1) if p in PREFETCH_PHASES else 0.0 for r in range(2)]
                                            for p in PHASES} if prefetch else {})
        out.append(record)
    return out


def _metrics(**over: Any) -> dict[str, Any]:
    """A 2-rank metrics.json as the ranks leave it (``phase_clock`` and the splits only where the build has them)."""
    metrics = {"epochs": _epochs(), "phase_clock": "wall_clock", "metric_name": "accuracy", "test_metric": 0.7,
               "test_metric_last": 0.69, "best_val_metric": 0.6, "best_epoch": 2, "last_epoch": 2,
               "final_val_metric": 0.6, "stopped_early": False, "test_metrics": {"accuracy": 0.7},
               "task": {"name": "node classification", "evaluator": "accuracy", "metric": "accuracy"},
               "recipe": {"loss": "cross_entropy", "lr": 0.01, "weight_decay": 0.0, "lr_schedule": "constant",
                          "patience": None},
               "model": {"kind": "sage", "kwargs": {}, "in_channels": 16, "hidden": 32, "out_channels": 4,
                         "num_layers": 2, "whole_batch": False, "parameters": 1234},
               "world_size": 2, "ranks": [{"rank": 0}, {"rank": 1}], "cache_policy": "hotness", "device": "cpu",
               "backend": "gloo", "resumed_from_epoch": None}
    return {**metrics, **over}


def _older(metrics: dict[str, Any]) -> dict[str, Any]:
    """The same metrics as a build before the phase split wrote them."""
    old = copy.deepcopy(metrics)
    old.pop("phase_clock")
    for e in old["epochs"]:
        e.pop("phases_s"), e.pop("prefetch_phases_s")
    return old


# ---- the means ---------------------------------------------------------------------------------------------------
def test_the_means_leave_the_first_epoch_out():
    means = mean_phases(_epochs(3))
    assert means is not None and list(means) == list(PHASES)
    for i, name in enumerate(PHASES):   # epochs 1 and 2: no warm-up second, 0.01 * epoch on top
        assert means[name] == pytest.approx([0.1 * (i + 1) * (r + 1) + 0.015 for r in range(2)])
    assert epochs_label(_epochs(3)) == "epochs 2-3 (epoch 1 left out: warm-up)"


def test_one_epoch_is_its_own_mean():
    one = _epochs(1)
    assert mean_phases(one) == one[0]["phases_s"] and epochs_label(one) == "epoch 1"


def test_missing_or_empty_splits_give_none():
    assert mean_phases(_epochs(3, phases=False)) is None and mean_phases([]) is None
    assert mean_phases(_epochs(3, prefetch=False), "prefetch_phases_s") is None   # {} without prefetch
    zeros = [{"epoch": e, "prefetch_phases_s": {"sample": [0.0, 0.0]}} for e in range(3)]
    assert mean_phases(zeros, "prefetch_phases_s") is None, "a thread that measured nothing: no bars, no table"
    assert epochs_label(_epochs(2, phases=False)) == ""
    # an epoch without the key (a record of an older build, resumed) is not averaged as zeros
    mixed = _epochs(3, phases=False)[:1] + _epochs(3)[1:]
    assert mean_phases(mixed) == mean_phases(_epochs(3)[1:]) == _epochs(3)[2]["phases_s"]


def test_an_unknown_phase_is_kept_after_the_known_ones():
    epochs = _epochs(1)
    epochs[0]["phases_s"]["compile"] = [0.5, 0.25]
    epochs[0]["phases_s"].pop("wait")
    means = mean_phases(epochs)
    assert means is not None and list(means) == [*PHASES, "compile"]
    assert means["compile"] == [0.5, 0.25] and means["wait"] == [0.0, 0.0]
    assert set(PHASE_LABELS) == set(PHASES)


# ---- the figure --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [True, False])
def test_the_figure_is_a_png_with_or_without_prefetch(prefetch: bool, monkeypatch: pytest.MonkeyPatch):
    from stages.train import plot

    legends: list[list[str]] = []
    real_png = plot._png
    monkeypatch.setattr(plot, "_png", lambda fig: legends.append([t.get_text() for t in fig.axes[0].get_legend()
                                                                  .get_texts()]) or real_png(fig))
    png = phases_png(_metrics(epochs=_epochs(3, prefetch=prefetch)))
    assert png is not None and png[:4] == PNG
    # the prefetch thread's wait is its idle time, in a legend entry of its own, never the model's "waiting"
    assert ("prefetch thread: idle, ahead of the model" in legends[0]) == prefetch
    assert "waiting for the batch" in legends[0]


def test_no_phases_no_figure():
    assert phases_png(_older(_metrics())) is None and phases_png({"epochs": []}) is None


# ---- the artifact, the report, the tracker scalars ---------------------------------------------------------------
def _build(tmp_path: Path, metrics: dict[str, Any]) -> tuple[ArtifactStore, Manifest]:
    """What the train stage publishes from the ranks' results (no ranks: the results are given)."""
    store = ArtifactStore(str(tmp_path / "art"))
    with store.writing("train", "0123456789abcdef", version=train.VERSION, params={"epochs": 3},
                       upstream={}) as writer:
        train.write_build(writer, b"model", metrics, num_partitions=2, nnodes=1)
    assert writer.manifest is not None
    return store, writer.manifest


def test_the_report_says_where_the_time_goes(tmp_path: Path):
    metrics = _metrics()
    store, manifest = _build(tmp_path, metrics)
    assert store.read_bytes("train", manifest.key, PHASES_PNG)[:4] == PNG
    # the summary keeps the means, not every epoch's split
    t = TrainSummary.from_json(manifest.summary)
    assert not any("phases_s" in e or "prefetch_phases_s" in e for e in t.epochs)
    assert (t.phase_clock, t.phase_epochs) == ("wall_clock", "epochs 2-3 (epoch 1 left out: warm-up)")
    assert t.phases_s["sample"] == pytest.approx([0.115, 0.215]) and t.prefetch_phases_s["sample"] == [0.05, 0.1]
    assert {name for name, v in t.prefetch_phases_s.items() if any(v)} == set(PREFETCH_PHASES)

    report = train.report(manifest)
    assert report.images["where the time goes"] == PHASES_PNG
    section = report.markdown.split("### Where the time goes")[1]
    assert "| phase | rank 0 s/epoch | rank 1 s/epoch | share of the epoch |" in section
    assert "wall clock" in section and "epochs 2-3 (epoch 1 left out: warm-up)" in section
    totals = [sum(v[r] for v in t.phases_s.values()) for r in range(2)]
    assert f"| **training pass** | {totals[0]:.4g} | {totals[1]:.4g} | 100.0 % |" in section
    share = sum(t.phases_s["other"][r] / totals[r] for r in range(2)) / 2
    assert f"| other (`other`) | 1.015 | 2.015 | {100 * share:.1f} % |" in section
    assert "The largest: other" in section   # the heaviest phase of the fake split
    rows = [section.index(f"(`{name}`)") for name in PHASES]
    assert rows == sorted(rows), "in PHASES' order, though the summary's JSON sorted them by name"
    prefetch = section.split("The prefetch thread")[1]
    assert "gather: remote rows (`gather_remote`)" in prefetch and "(`forward_backward`)" not in prefetch
    assert "| idle, ahead of the model (`wait`) |" in prefetch and "waiting for the batch" not in prefetch
    assert "| waiting for the batch (`wait`) |" in section.split("The prefetch thread")[0]


def test_the_events_carry_each_phase_of_the_slowest_rank(tmp_path: Path):
    metrics = _metrics()
    scalars = {(tag, step): value for tag, step, value in epoch_scalars(metrics)}
    for e in metrics["epochs"]:
        for name, per_rank in e["phases_s"].items():
            assert scalars[(f"train/phase_s/{name}", e["epoch"])] == max(per_rank)
    assert not any("prefetch" in tag for tag, _ in scalars)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store, manifest = _build(tmp_path, metrics)
    acc = EventAccumulator(str(Path(store.url("train", manifest.key, event_file_name("train", manifest.key))).parent),
                           size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    events = acc.Scalars("train/phase_s/forward_backward")
    assert [s.step for s in events] == [e["epoch"] for e in metrics["epochs"]]
    assert [s.value for s in events] == pytest.approx([max(e["phases_s"]["forward_backward"])
                                                       for e in metrics["epochs"]])
    [image] = acc.Images("train/figures/phases")
    assert image.encoded_image_string == store.read_bytes("train", manifest.key, PHASES_PNG)


def test_a_build_before_the_split_shows_no_phases(tmp_path: Path):
    metrics = _older(_metrics())
    assert not any(tag.startswith("train/phase_s/") for tag, _, _ in epoch_scalars(metrics))
    store, manifest = _build(tmp_path, metrics)
    assert PHASES_PNG not in manifest.files
    assert not {"phase_clock", "phases_s", "prefetch_phases_s", "phase_epochs"} & set(manifest.summary)
    report = train.report(manifest)
    assert "Where the time goes" not in report.markdown and "where the time goes" not in report.images
