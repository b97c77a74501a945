"""Whether a plug-in module defines a callable ``name``, read from its source: ``check_ref``
(``stages.train.models.plugins``) asks this before any stage runs, so ``model=pkg.mod:typo`` fails at once instead of
inside rank 0 after the stages before train ran.

Why the source and not an import: the config check runs on every ``gnnpipe`` command and is meant to take
milliseconds, and a plug-in module typically imports torch and PyG (seconds) and is the user's code (side effects).
So the module's top-level statements are read (never executed): ``def``/``class``/``lambda`` bind a callable, a
literal (``build = 3``) binds something that is not. Where the source cannot tell (a name imported from elsewhere,
bound to a call's result, a ``from x import *``, a module ``__getattr__``, a compiled module), ``Lookup.UNKNOWN``
says so and the caller imports the module after all.
"""

from __future__ import annotations

import ast
import enum
from pathlib import Path

__all__ = ["Lookup", "defined_names", "look_up"]

# values that are never callable: what ``name = <literal>`` binds
_LITERALS = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr, ast.ListComp, ast.DictComp,
             ast.SetComp, ast.GeneratorExp)
# statements whose bodies run at import time, so the names they bind are the module's (not def/class bodies)
_BLOCKS = (ast.If, ast.Try, ast.With, ast.For, ast.While)


class Lookup(enum.Enum):
    CALLABLE = "callable"
    NOT_CALLABLE = "not callable"
    MISSING = "missing"
    UNKNOWN = "unknown"   # the source cannot tell: import the module to know


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement that runs at the module's top level, nested blocks' (if/try/with/for/while) included."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, _BLOCKS):
            for field in ("body", "orelse", "finalbody"):
                out.extend(_statements(getattr(stmt, field, [])))
            for handler in getattr(stmt, "handlers", []):
                out.extend(_statements(handler.body))
    return out


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:   # a bare annotation binds nothing
        return [stmt.target]
    return []


def _binding(stmt: ast.stmt, name: str) -> Lookup | None:
    """What ``stmt`` binds to ``name``, or None if it does not bind it."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return Lookup.CALLABLE if stmt.name == name else None
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        bound = [alias.asname or alias.name.split(".")[0] for alias in stmt.names]
        return Lookup.UNKNOWN if name in bound else None
    if isinstance(stmt, ast.AugAssign):   # build += ...: whatever it was, now something else
        return Lookup.UNKNOWN if isinstance(stmt.target, ast.Name) and stmt.target.id == name else None
    for target in _targets(stmt):
        if isinstance(target, ast.Name) and target.id == name:
            value = getattr(stmt, "value", None)
            if isinstance(value, ast.Lambda):
                return Lookup.CALLABLE
            return Lookup.NOT_CALLABLE if isinstance(value, _LITERALS) else Lookup.UNKNOWN
        if not isinstance(target, ast.Name) and any(isinstance(n, ast.Name) and n.id == name
                                                    for n in ast.walk(target)):
            return Lookup.UNKNOWN   # unpacking: a, build = ...
    if isinstance(stmt, (ast.For, ast.With)):   # for build in ...: / with ... as build:
        loop_vars = [stmt.target] if isinstance(stmt, ast.For) else [i.optional_vars for i in stmt.items
                                                                    if i.optional_vars is not None]
        if any(isinstance(n, ast.Name) and n.id == name for t in loop_vars for n in ast.walk(t)):
            return Lookup.UNKNOWN
    return None


def _dynamic(tree: ast.Module, statements: list[ast.stmt]) -> bool:
    """Whether the module may define names the source does not show: ``from x import *``, a module-level
    ``__getattr__``, ``globals()``/``setattr``/``exec`` anywhere, a walrus at the top level."""
    for stmt in statements:
        if isinstance(stmt, ast.ImportFrom) and any(alias.name == "*" for alias in stmt.names):
            return True
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__getattr__":
            return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("globals", "setattr", "exec", "vars"):
            return True
        if isinstance(node, (ast.NamedExpr, ast.Global)):
            return True
    return False


def look_up(path: Path, name: str) -> Lookup:
    """Whether module file ``path`` binds ``name`` at its top level to a callable (module docstring). A file that
    does not parse raises ``SyntaxError`` (importing it would fail too)."""
    if path.suffix != ".py":
        return Lookup.UNKNOWN   # a compiled module: no source to read
    tree = ast.parse(path.read_text(), filename=str(path))
    statements = _statements(tree.body)
    found = {b for stmt in statements if (b := _binding(stmt, name)) is not None}
    if not found:
        return Lookup.UNKNOWN if _dynamic(tree, statements) else Lookup.MISSING
    # bound more than once (if/else, try/except): certain only when every binding agrees
    return found.pop() if len(found) == 1 else Lookup.UNKNOWN


def defined_names(path: Path) -> list[str]:
    """The public functions and classes ``path`` defines at its top level (to suggest one in an error)."""
    if path.suffix != ".py":
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    return [s.name for s in _statements(tree.body)
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not s.name.startswith("_")]
