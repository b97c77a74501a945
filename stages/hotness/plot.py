"""The hit-rate curve as a PNG: hotness plan vs degree-ranked cache vs the ceiling, one colour per partition."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on workers or CI
import matplotlib.pyplot as plt  # noqa: E402


def hit_rate_png(curves: list[dict[str, Any]]) -> bytes:
    """``curves``: per partition ``{"part", "fraction": [...], "hotness": [...], "degree": [...], "ceiling": [...]}``
    (the ceiling: the held-out epoch's own top rows at each size)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for i, c in enumerate(curves):
        colour = f"C{i % 10}"
        pct = [100 * f for f in c["fraction"]]
        ax.plot(pct, [100 * h for h in c["hotness"]], "-o", color=colour, ms=3, label=f"part {c['part']} hotness")
        ax.plot(pct, [100 * h for h in c["degree"]], "--", color=colour, alpha=0.7, label=f"part {c['part']} degree")
        if "ceiling" in c:   # builds before it stored none
            ax.plot(pct, [100 * h for h in c["ceiling"]], ":", color=colour, alpha=0.9,
                    label=f"part {c['part']} ceiling")
    ax.set_xscale("log")
    ax.set_xlabel("cache size (% of the partition's own rows)")
    ax.set_ylabel("hit rate (% of feature lookups)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Feature-cache hit rate: pre-sampled hotness vs in-degree vs the ceiling")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
