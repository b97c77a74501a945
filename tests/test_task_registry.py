"""The task registry (stages.train.tasks): the built-in tasks are registered, an unknown name is one InputError, the
``task`` Literal agrees with the registry, no task-name branch is left in train or hotness, and a third task trains
through the unchanged trainer."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
import torch

from stages.choices import TaskName
from stages.train.tasks import TASKS, TaskDef, task_def
from storage.errors import InputError
from tests._block_graphs import one_rank_data

ROOT = Path(__file__).resolve().parent.parent


def test_registry_lists_node_and_link_and_matches_the_task_literal():
    assert {"node", "link"} <= set(TASKS)
    assert set(typing.get_args(TaskName)) == set(TASKS)
    assert all(task_def(name).name == name for name in TASKS)


def test_an_unknown_task_is_one_input_error_naming_the_known_ones():
    with pytest.raises(InputError, match="node, link"):
        task_def("graph")


def test_no_task_name_branch_in_train_or_hotness():
    pattern = re.compile(r"task\s*[!=]=|==\s*[\"']link[\"']")
    hits = [f"{path.relative_to(ROOT)}:{n}" for folder in ("stages/train", "stages/hotness")
            for path in sorted((ROOT / folder).rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


class ParityDef(TaskDef):
    """A toy third task: a node's class is its gid's parity (a relabelled classification, two classes)."""

    name = "parity"
    key_fields = ("task",)

    def output_width(self, hidden: int, num_classes: int) -> int:
        return 2

    def build(self, params: Any, data: Any, generator: torch.Generator) -> Any:
        from stages.train.tasks import NodeClassification

        return NodeClassification(lambda gid: gid % 2, data.split_gid, precision=params.precision)


def test_a_third_task_trains_through_the_trainer_unchanged(one_rank_group, tmp_path, monkeypatch):  # noqa: F811
    from stages.train.params import Params
    from stages.train.rank.trainer import Trainer
    from stages.train.spec import TrainSpec

    monkeypatch.setitem(TASKS, "parity", ParityDef())
    params = Params(hidden=8, fanouts=(5, 5), batch_size=4096, epochs=1).model_copy(update={"task": "parity"})
    key = params.key_params()
    assert key["task"] == "parity" and "decoder" not in key and "num_negatives" not in key
    spec = TrainSpec(artifacts=str(tmp_path), key="k", partition_key="p", features_key="f", hotness_key="h",
                     params={}, checkpoint_dir=str(tmp_path / "ckpt"), result_dir=str(tmp_path / "out"))
    trainer = Trainer(spec, params, one_rank_data())
    assert trainer.out_channels == 2 and trainer.model is trainer.encoder
    metrics = trainer.fit()
    assert metrics["last_epoch"] == 0 and len(metrics["epochs"]) == 1
    assert metrics["metric_name"] == "accuracy" and 0.0 <= metrics["test_metric"] <= 1.0
    assert "decoder" not in metrics["model"]
