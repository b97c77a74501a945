"""A plug-in's identity: the digest of its code that joins the train artifact's key (``Params.key_params``) and the
nodes' code fingerprint (``stages.train.spec.code_digest``).

It covers the plug-in's module and the modules it imports from beside it (its package, or its directory), as ASTs:
comments and formatting do not count, code does, so an edit retrains. Names, not paths, enter the digest, so the
same code has the same key on any machine and in any directory. gnnpipe's own packages are left out (their changes
are caught by the stage's VERSION, docs/design.md §3), and so are installed libraries outside the plug-in's package
(pin their versions yourself). Torch-free: it reads files and never imports the plug-in.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Sequence
from pathlib import Path

from stages.code_files import import_closure
from stages.train.models.plugins import is_import_path, module_origin
from storage.errors import InputError

GNNPIPE_PACKAGES = ("stages", "storage", "flows")


def source_files(module: str) -> dict[str, Path]:
    """Module name -> file of ``module`` and of what it imports from beside it (see the module docstring)."""
    origin = module_origin(module)
    if origin is None:
        raise InputError(f"plug-in module {module} not found on the Python path")
    if origin.suffix != ".py":
        return {module: origin}   # a compiled module: its bytes
    parts = module.split(".")
    root = origin.parents[len(parts) - (0 if origin.name == "__init__.py" else 1)]
    own_package_only = root.name in ("site-packages", "dist-packages")

    def keep(name: str) -> bool:
        top = name.split(".")[0]
        return top not in GNNPIPE_PACKAGES and not (own_package_only and top != parts[0])

    try:
        return import_closure([module], root, keep)
    except SyntaxError as err:
        raise InputError(f"plug-in source {err.filename}: {err}") from None


def source_digest(ref: str) -> str:
    """A digest of the code behind import path ``ref``: equal on any machine with the same code, wherever it is."""
    h = hashlib.sha256()
    for name, path in source_files(ref.split(":")[0]).items():
        body = ast.dump(ast.parse(path.read_text())) if path.suffix == ".py" else path.read_bytes().hex()
        h.update(name.encode() + b"\0" + body.encode() + b"\0")
    return h.hexdigest()[:16]


def plugin_files(refs: Sequence[str]) -> list[Path]:
    """The source files of those of ``refs`` that are import paths (built-in names have none)."""
    files = {p for ref in refs if is_import_path(ref) for p in source_files(ref.split(":")[0]).values()}
    return sorted(files)
