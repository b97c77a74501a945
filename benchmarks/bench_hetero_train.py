"""R-GCN on a typed graph ([5/7]): epoch time and test accuracy on 1 rank vs 2 ranks, the real stages end to end.

    python benchmarks/bench_hetero_train.py --nodes 200000 --parts 1 2 --epochs 3 --root /tmp/bench-hetero-train

``--infer``: then exact inference of every node of every type on the trained model (the infer stage; the trained
upstream is found cached in ``--root``), one more JSON line per number of partitions.

``synthetic-hetero`` (ogbn-mag's types and proportions), R-GCN 2 layers, fanouts [25, 20] per edge type, batch
1024 per rank (the issue's configuration), hotness-remote cache (the CPU default). Both configurations run on the
same machine: 2 ranks share its cores (torch threads = cores / ranks). One JSON line per number of partitions:
stage times, mean epoch time, test accuracy at the best validation epoch, feature cache hit rate and remote MiB
per epoch.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from _graph_args import add_hetero_args, hetero_params  # benchmarks/ is on sys.path when run as a script

from flows.direct import run_stages
from storage.summaries import DownloadSummary, InferSummary
from storage.train_summary import TrainSummary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_hetero_args(ap, nodes=200_000, parts=[1, 2], root="/tmp/bench-hetero-train")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--model", default="rgcn")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--infer", action="store_true", help="also infer every node exactly (the infer stage)")
    args = ap.parse_args()
    os.makedirs(args.root, exist_ok=True)
    for parts in args.parts:
        _, m = run_stages({**hetero_params(args, parts), "model": args.model, "fanouts": [25, 20], "batch_size": 1024,
                           "hidden": args.hidden, "epochs": args.epochs, "until": "train"})
        s = m["train"].summary
        t, graph = TrainSummary.from_json(s), DownloadSummary.from_json(m["download"].summary)
        print(json.dumps({
            "nodes": graph.num_nodes, "edges": graph.num_edges,
            "parts": parts, "model": args.model, "epochs": len(s["epochs"]),
            **{f"{stage}_s": round(m[stage].summary["wall_s"], 1)
               for stage in ("download", "partition", "features", "hotness")},
            "train_job_s": round(m["train"].summary.get("wall_s", 0.0), 1),
            "epoch_s": [round(e["epoch_s"], 2) for e in s["epochs"]],
            "edges_per_s_M": round(sum(e["sampled_edges_per_s"] for e in s["epochs"]) / len(s["epochs"]) / 1e6, 2),
            "test_acc": t.test_metric, "best_val_acc": t.best_val_metric,
            "hit_rate": round(s["mean_hit_rate"], 4), "remote_MiB_per_epoch": round(
                s["remote_bytes_per_epoch"] / 2**20, 1)}), flush=True)
        if args.infer:
            print(json.dumps(infer_figures(args, parts)), flush=True)


def infer_figures(args: argparse.Namespace, parts: int) -> dict[str, Any]:
    """The infer stage (exact) on the run ``main`` trained: its wall time, per-layer seconds, peak RSS, accuracy."""
    _, m = run_stages({**hetero_params(args, parts), "model": args.model, "fanouts": [25, 20], "batch_size": 1024,
                       "hidden": args.hidden, "epochs": args.epochs, "until": "infer"})
    s = InferSummary.from_json(m["infer"].summary)
    return {"stage": "infer", "parts": parts, "path": s.path, "job_wall_s": round(s.wall_s, 1),
            "rank_wall_s": [r["wall_s"] for r in s.ranks], "layer_s": [r["layer_s"] for r in s.ranks],
            "peak_rss_MiB": [r["peak_rss_mib"] for r in s.ranks],
            "remote_MiB": [r["remote_mib"] for r in s.ranks], "accuracy": s.accuracy,
            "sampled_test_acc": s.sampled_accuracy["test"]}


if __name__ == "__main__":
    main()
