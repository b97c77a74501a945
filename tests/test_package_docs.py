"""Every package's map names all its rooms: each module (and sub-package) of ``stages/``, ``stages/*/``,
``storage/`` and ``flows/`` appears in its ``__init__.py`` docstring as ``name``, so a newcomer reading the map
misses none."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted([*(p.parent for p in (ROOT / "stages").glob("*/__init__.py")), ROOT / "stages", ROOT / "storage",
                   ROOT / "flows"])


def rooms(package: Path) -> list[str]:
    """The package's modules and sub-packages, by name (``__init__`` and ``__main__`` are the package itself)."""
    modules = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    subpackages = [p.parent.name for p in package.glob("*/__init__.py")]
    return sorted(modules + subpackages)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_docstring_names_every_module(package: Path):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    missing = [name for name in rooms(package) if f"``{name}``" not in doc]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py's docstring does not name {missing}"
