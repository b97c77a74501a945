"""Infer's task seam (``stages.infer.tasks``): a build's task is looked up by the train manifest's ``task``, an
unknown task is one InputError, and no infer module, the infer artifact's reader nor the export command compares
task names (adding a task is one implementation in ``stages.infer.tasks``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stages.infer.tasks import INFER_TASKS, LinkTask, NodeTask, build_task, infer_task
from storage import InputError, Manifest
from storage.summaries import InferSummary

ROOT = Path(__file__).resolve().parent.parent


def _train(params: dict[str, object]) -> Manifest:
    return Manifest(stage="train", version=1, key="k" * 16, params=params, upstream={}, created="", files={}, bytes=0,
                    summary={}, libraries={}, uri="", build_id="")


def test_lookup_by_the_train_manifest() -> None:
    assert isinstance(infer_task(_train({"model": "sage"})), NodeTask)   # no task recorded: a node classifier
    assert isinstance(infer_task(_train({"task": "node"})), NodeTask)
    link = infer_task(_train({"task": "link", "decoder": "dot"}))
    assert isinstance(link, LinkTask) and link.scores_pairs and not link.classes
    assert INFER_TASKS["node"].classes and not INFER_TASKS["node"].scores_pairs
    assert isinstance(build_task(InferSummary()), NodeTask)
    assert isinstance(build_task(InferSummary.from_json({"task": "link"})), LinkTask)


def test_unknown_task_is_one_input_error() -> None:
    with pytest.raises(InputError, match="task=graph is not a known task: use one of node, link") as err:
        infer_task(_train({"task": "graph"}))
    assert "\n" not in str(err.value)


def test_every_registered_task_has_its_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    """One list of tasks, the train registry's; a task registered there without an inference is one line."""
    from stages.train.tasks import TASKS
    from stages.train.tasks.kinds import NODE

    assert set(INFER_TASKS) == set(TASKS)
    monkeypatch.setitem(TASKS, "graph", NODE)
    with pytest.raises(InputError, match="task 'graph' has no inference"):
        infer_task(_train({"task": "graph"}))


def test_link_model_state_is_its_encoder() -> None:
    state = {"encoder.w": 1, "decoder.w": 2}
    assert LinkTask().model_state(state) == {"w": 1}
    assert NodeTask().model_state(state) == state


BRANCH = re.compile(r"task\s*==|task\s*!=|==\s*[\"']link[\"']|is_link")


def test_no_task_name_branches() -> None:
    files = [*sorted((ROOT / "stages" / "infer").rglob("*.py")), ROOT / "storage" / "infer_artifact.py",
             ROOT / "flows" / "cli_export.py"]
    hits = [f"{f.relative_to(ROOT)}:{n}: {line.strip()}" for f in files
            for n, line in enumerate(f.read_text().splitlines(), 1) if BRANCH.search(line)]
    assert not hits, "task name branches (ask stages.infer.tasks / InferArtifact instead):\n" + "\n".join(hits)
