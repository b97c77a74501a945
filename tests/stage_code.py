"""What each stage's code is, as a digest, and the record that ties it to the stage's VERSION (docs/design.md §3).

A stage's artifact key covers its parameters, its upstream keys and its VERSION, not its source: hashing source
would re-key (and rebuild, for hours at scale) every artifact on a comment edit. Instead ``stage_code.json`` records
each stage's VERSION with a digest of the code it runs, and tests/test_stage_versions.py fails when the code changed
but the record did not: whoever changes a stage decides, then either bumps VERSION (what it computes or writes
changed: old artifacts must not be reused) or not (a refactor), and records with::

    python -m tests.stage_code --update

The digest covers every gnnpipe module the stage module reaches by import (function-level imports included), plus
the modules it starts as programs (the train stage's torchrun entry), as ASTs without docstrings: comments,
docstrings and formatting do not count, code does.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

from stages.code_files import import_closure

REPO = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("stage_code.json")
PACKAGES = ("stages", "storage")
# modules a stage runs in another process (by name, so no import reaches them)
PROGRAMS = {"train": ("stages.train.rank.worker",), "infer": ("stages.infer.worker",)}


def closure(roots: tuple[str, ...], root: Path = REPO) -> list[Path]:
    """The files of ``roots`` and of every gnnpipe module they import, transitively (parent packages included)."""
    files = import_closure(roots, root, keep=lambda name: name.split(".")[0] in PACKAGES)
    return sorted(files.values())


def _normalised(path: Path) -> str:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree, annotate_fields=False)


def stage_digest(stage: str, root: Path = REPO) -> str:
    h = hashlib.sha256()
    for path in closure((f"stages.{stage}.stage", *PROGRAMS.get(stage, ())), root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + _normalised(path).encode() + b"\0")
    return h.hexdigest()[:16]


def current(root: Path = REPO) -> dict[str, dict[str, object]]:
    sys.path.insert(0, str(root))
    from flows.config import STAGES

    return {name: {"version": module.VERSION, "digest": stage_digest(name, root)} for name, module in STAGES.items()}


def main(argv: list[str]) -> int:
    if argv != ["--update"]:
        print(__doc__)
        return 2
    RECORD.write_text(json.dumps(current(), indent=2, sort_keys=True) + "\n")
    print(f"recorded {RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
