"""What a stage shows a person: a headline, a table and markdown (published as Prefect artifacts by the flow)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Report:
    headline: str                                   # one line, for logs and `gnnpipe status`
    table: list[dict[str, Any]] = field(default_factory=list)
    markdown: str = ""
    images: dict[str, str] = field(default_factory=dict)  # title -> PNG path relative to the artifact directory


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A GitHub-flavoured markdown table of ``rows`` (same keys in every row)."""
    if not rows:
        return ""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def percent(value: float | None, digits: int = 2) -> str:
    """A ratio as ``"93.40 %"``, or ``"n/a"`` when there is none (None or NaN: e.g. accuracy over an empty split,
    which is not 0 %)."""
    if value is None or math.isnan(value):
        return "n/a"
    return f"{100 * value:.{digits}f} %"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
