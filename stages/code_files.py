"""Which source files a module runs: its own and those of the modules it imports, transitively, found by reading the
files (never importing them).

Two digests are built on this: a plug-in's code in the train artifact's key (``stages.train.models.plugin_code``) and
each stage's recorded code digest (``tests/stage_code.py``, docs/design.md §3). Each decides which modules count
(``keep``) and how a file enters its digest.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["import_closure", "imported_modules", "module_file"]


def module_file(root: Path, module: str) -> Path | None:
    """The file of ``module`` under ``root`` (``a/b.py`` or ``a/b/__init__.py``), or None."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path, module: str) -> set[str]:
    """What ``path`` (module ``module``) imports, function-level imports included and relative ones resolved; for
    ``from a import b`` both ``a`` and ``a.b`` (which may be a module), the caller keeps those that have a file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)] if package else []
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base:
                found.add(base)
            found |= {f"{base}.{alias.name}".lstrip(".") for alias in node.names}
    return found


def import_closure(roots: Iterable[str], root: Path, keep: Callable[[str], bool]) -> dict[str, Path]:
    """Module name -> file, for ``roots`` and every module under ``root`` they reach by import and ``keep`` accepts
    (parent packages included: importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``). A file that does not
    parse raises ``SyntaxError`` naming it."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if not keep(name):
            continue
        pieces = name.split(".")
        for i in range(1, len(pieces) + 1):
            prefix = ".".join(pieces[:i])
            path = module_file(root, prefix)
            if path is None or prefix in seen:
                continue
            seen[prefix] = path
            todo.extend(imported_modules(path, prefix))
    return dict(sorted(seen.items()))
