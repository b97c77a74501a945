"""The products-scale synthetic graph every benchmark runs on, as command-line options (one definition)."""

from __future__ import annotations

import argparse
from typing import Any


def add_graph_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", type=int, default=2_400_000)
    ap.add_argument("--avg-degree", type=float, default=50.0)
    ap.add_argument("--features", type=int, default=100)
    ap.add_argument("--classes", type=int, default=47)


def download_params(args: argparse.Namespace) -> dict[str, Any]:
    """The download stage's params for those options (seed 0), so benchmarks share one cached graph."""
    return {"num_nodes": args.nodes, "avg_degree": args.avg_degree, "num_features": args.features,
            "num_classes": args.classes, "seed": 0}
