"""A change to a stage's code is caught by its VERSION (tests/stage_code.py says how, docs/design.md §3 why)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.stage_code import RECORD, REPO, closure, current, stage_digest


def test_each_stage_code_matches_its_recorded_version():
    recorded = json.loads(RECORD.read_text())
    now = current()
    changed = [name for name in now if recorded.get(name) != now[name]]
    assert not changed, (
        f"the code of stage(s) {', '.join(changed)} changed since their VERSION was recorded: if what a stage "
        f"computes or writes changed, bump its VERSION (its old artifacts must not be reused); then record with "
        f"`python -m tests.stage_code --update`")


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for pkg in ("stages", "storage", "flows"):
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_digest_sees_code_but_not_comments_or_docstrings(tree_copy: Path):
    before = {name: stage_digest(name, tree_copy) for name in ("download", "partition", "hotness", "train")}
    relabel = tree_copy / "stages" / "partition" / "relabel.py"
    _edit(relabel, '"""', '"""A docstring edit. ')
    relabel.write_text(relabel.read_text() + "\n# a comment\n")
    assert stage_digest("partition", tree_copy) == before["partition"]
    _edit(relabel, "def ", "def _added_helper() -> int:\n    return 1\n\n\ndef ")
    assert stage_digest("partition", tree_copy) != before["partition"]
    assert stage_digest("download", tree_copy) == before["download"], "download does not import the partition code"
    # a module the stage only reaches through a function-level import, and the ranks' program, count too
    sampler = tree_copy / "stages" / "runtime" / "sampling" / "sampler.py"
    sampler.write_text(sampler.read_text() + "\nX = 1\n")
    assert stage_digest("hotness", tree_copy) != before["hotness"]
    assert stage_digest("train", tree_copy) != before["train"]


def test_the_train_stage_covers_the_code_its_ranks_run():
    files = {str(p.relative_to(REPO)) for p in closure(("stages.train.stage", "stages.train.rank.worker"))}
    assert {"stages/train/rank/worker.py", "stages/runtime/sampling/uniform.py", "stages/runtime/dist_features.py",
            "storage/store.py"} <= files
