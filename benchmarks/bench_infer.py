"""Exact (and optionally sampled) inference of every node against the train stage's sampled evaluation.

The pipeline runs up to train through the real stages into ``--root`` (cached there: a second run only infers),
then the infer stage runs (forced, so it is timed) exactly and, with ``--sampled``, with those fanouts. Figures come
from the stages' manifests: each rank's inference wall time and peak RSS (kernel VmHWM), the exchange's remote
bytes, the job's wall time (torchrun start and the orig-order export included); and the train stage's validation
pass (``eval_s`` of its last epoch: sampled neighbourhoods, the slowest rank) scaled to 10 % of the nodes, the
issue's yardstick ("exact inference of all nodes in less time than the sampled evaluation of 10 % of them").
Prints one JSON line per run and a markdown table. ``--devices cuda,cpu`` runs exact inference on each device in
turn (issue [4/5] item 4: one GPU against the CPU), with each layer's placement and the largest difference of the
probabilities from the first device's.

Products scale (do not run on a busy box)::

    python benchmarks/bench_infer.py --nodes 2400000 --avg-degree 50 --features 100 --classes 47 --epochs 1 \
        --sampled 15,10,5

Small scale (a smoke test, ~1 min)::

    python benchmarks/bench_infer.py --nodes 20000 --avg-degree 20 --features 32 --classes 8 --hidden 64 \
        --batch-size 512 --epochs 1 --root /tmp/bench-infer --sampled 10,5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from _graph_args import add_graph_args  # benchmarks/ is on sys.path when run as a script
from _train_bench import upstream_values

from storage.summaries import InferSummary
from storage.train_summary import TrainSummary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def stage_values(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline values up to train: the training benchmarks' upstream (``_train_bench.upstream_values``, so a
    graph they built is reused), then the model."""
    return {**upstream_values(args, args.parts, feature_dtype=args.feature_dtype), "hidden": args.hidden,
            "train.epochs": args.epochs, "until": "train"}


def build_to_train(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """download → ... → train through the stages (cached in ``--root``): ``(store, manifests)``."""
    from flows.direct import run_stages

    values = stage_values(args)

    def said(name: str, manifest: Any) -> None:
        print(json.dumps({"stage": name, "key": manifest.key, "wall_s": manifest.summary.get("wall_s")}), flush=True)

    return run_stages(values, on_built=said)


def infer_once(store: Any, manifests: dict[str, Any], fanouts: list[int] | None, args: argparse.Namespace,
               device: str = "auto") -> dict[str, Any]:
    import numpy as np

    from stages.infer import stage as infer
    from storage.infer_artifact import InferArtifact

    params = infer.Params(fanouts=fanouts, chunk_edges=args.chunk_edges, threads_per_rank=args.threads,
                          device=device)
    manifest = infer.run(store, params, {u: manifests[u] for u in infer.UPSTREAM}, force=True,
                         log=(print if args.verbose else lambda line: None))
    s = InferSummary.from_json(manifest.summary)
    prob = np.asarray(InferArtifact(store, manifest).node_array("prob")[:])
    return {"mode": s.mode, "fanouts": s.fanouts, "nodes": s.num_nodes, "parts": s.num_partitions,
            "device": [r.get("device") for r in s.ranks], "placement": [r.get("placement") for r in s.ranks],
            "_prob": prob,
            "job_wall_s": s.wall_s, "rank_wall_s": max(r["wall_s"] for r in s.ranks),
            "layer_s": [r["layer_s"] for r in s.ranks],
            # the rest of a rank's time, and of the job's: opening its inputs, writing its outputs; the ranks'
            # job (their start and exit included) and the export in orig-id order
            "open_s": [r.get("open_s") for r in s.ranks], "write_s": [r.get("write_s") for r in s.ranks],
            "ranks_job_s": s.scalars.get("infer/ranks_job_s"), "export_s": s.scalars.get("infer/export_s"),
            "peak_rss_GiB": [round(r["peak_rss_mib"] / 1024, 2) for r in s.ranks],
            "remote_GiB": round(sum(r["remote_mib"] for r in s.ranks) / 1024, 3),
            "acc": s.accuracy, "chunk_edges": args.chunk_edges}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_args(ap)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[15, 10, 5],
                    help="training fanouts (the model has one layer per hop)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--feature-dtype", default="auto", help="the features stage's dtype (the stored rows)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--chunk-edges", type=int, default=1 << 18)
    ap.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: CPUs / ranks)")
    ap.add_argument("--sampled", default=None, help="also run sampled inference with these fanouts")
    ap.add_argument("--devices", default="auto", help="exact inference on each of these in turn (auto, cpu, cuda)")
    ap.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "artifacts"))
    ap.add_argument("--verbose", action="store_true", help="stream the ranks' log lines")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    store, manifests = build_to_train(args)
    train = manifests["train"].summary
    test = TrainSummary.from_json(train).test_metric
    last = train["epochs"][-1]
    valid_nodes = sum(r["valid_nodes"] for r in train["ranks"])
    eval_10pct_s = last["eval_s"] * (0.1 * args.nodes) / max(valid_nodes, 1)
    baseline = {"train_sampled_valid_pass_s": last["eval_s"], "valid_nodes": valid_nodes,
                "sampled_eval_of_10pct_nodes_s": round(eval_10pct_s, 2), "train_test_acc": test}
    print(json.dumps(baseline), flush=True)
    runs = [infer_once(store, manifests, None, args, device) for device in args.devices.split(",")]
    for run in runs[1:]:   # the same model on the same rows: the devices agree to float32 rounding
        run["max_abs_diff_prob_vs_first"] = float(abs(run["_prob"] - runs[0]["_prob"]).max())
    if args.sampled:
        runs.append(infer_once(store, manifests, [int(f) for f in args.sampled.split(",")], args))
    for run in runs:
        del run["_prob"]
        run["faster_than_sampled_eval_of_10pct"] = run["rank_wall_s"] < eval_10pct_s
        print(json.dumps(run), flush=True)
    print("\n| inference | nodes | parts | rank wall s | job wall s | peak RSS GiB/rank | remote GiB | test acc |"
          "\n|---|---|---|---|---|---|---|---|")
    for run in runs:
        how = (f"exact ({run['device'][0]})" if run["mode"] == "exact" else
               f"sampled {','.join(map(str, run['fanouts']))}")
        print(f"| {how} | {run['nodes']:,} | {run['parts']} | {run['rank_wall_s']:.1f} | {run['job_wall_s']:.1f} | "
              f"{max(run['peak_rss_GiB']):.2f} | {run['remote_GiB']:.3f} | {100 * (run['acc']['test'] or 0):.2f} % |")
    print(f"| train stage: sampled valid pass x 10 % / valid | {int(0.1 * args.nodes):,} | {args.parts} | "
          f"{eval_10pct_s:.1f} | | | | {100 * (test or 0):.2f} % |")


if __name__ == "__main__":
    main()
