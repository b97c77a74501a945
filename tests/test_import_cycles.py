"""No import cycle among gnnpipe's modules: the module-level imports of ``stages``, ``storage`` and ``flows`` (read
from source, never imported; ``TYPE_CHECKING`` blocks and function-level imports left out, as they run later) form
no loop. A module importing its own parent package is no edge: that package is already being imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "storage", "flows")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                found += _top_level_imports(node.body)
            found += _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _top_level_imports(block)
    return found


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _top_level_imports(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            base = ".".join([*up, *([node.module] if node.module else [])])
        targets |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    out = set()
    for target in targets:
        pieces = target.split(".")
        for i in range(1, len(pieces) + 1):   # importing a.b.c runs a and a.b first
            prefix = ".".join(pieces[:i])
            if prefix in modules and prefix != name and not name.startswith(prefix + "."):
                out.add(prefix)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
