"""The synthetic graphs the benchmarks run on, as command-line options (one definition each): the products-scale
homogeneous one, and ``synthetic-hetero`` with ogbn-mag's paper features and classes."""

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


def add_hetero_args(ap: argparse.ArgumentParser, *, nodes: int, parts: list[int], root: str) -> None:
    ap.add_argument("--nodes", type=int, default=nodes)
    ap.add_argument("--features", type=int, default=128, help="paper feature columns (ogbn-mag: 128)")
    ap.add_argument("--classes", type=int, default=349, help="paper classes (ogbn-mag: 349)")
    ap.add_argument("--parts", type=int, nargs="+", default=parts)
    ap.add_argument("--root", default=root)


def hetero_params(args: argparse.Namespace, parts: int) -> dict[str, Any]:
    """The run's values for those options and ``parts`` partitions."""
    return {"artifacts": args.root, "dataset": "synthetic-hetero", "num_nodes": args.nodes,
            "num_features": args.features, "num_classes": args.classes, "num_partitions": parts}
