"""Products-scale timing of the data stages: download (generate), partition and features, each in a fresh process.

Each stage runs in its own interpreter so its peak RSS is its own (a long-lived process keeps freed arenas).
Figures come from the stage's own manifest (``wall_s``, sampled ``peak_rss_bytes``); the goal is checked against
the size of graph + features.

    python benchmarks/bench_pipeline.py --nodes 2400000 --avg-degree 50 --features 100 --parts 2,4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _graph_args import add_graph_args, download_params  # benchmarks/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]

STAGE_SCRIPT = """
import json, sys
from storage import ArtifactStore
from stages.download import stage as download
from stages.partition import stage as partition
from stages.features import stage as features
root, name, dl_params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
parts, force = int(sys.argv[4]), sys.argv[5] == "1"
store = ArtifactStore(root)
dl = download.run(store, download.Params(**dl_params), {}, force=force and name == "download", progress=False)
m = dl
if name in ("partition", "features"):
    m = pt = partition.run(store, partition.Params(num_partitions=parts), {"download": dl},
                           force=force and name == "partition", progress=False)
if name == "features":
    m = features.run(store, features.Params(), {"download": dl, "partition": pt}, force=force, progress=False)
print("RESULT " + json.dumps(m.summary))
"""


def run_stage(root: str, name: str, dl_params: dict, parts: int, force: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", STAGE_SCRIPT, root, name, json.dumps(dl_params), str(parts),
                           "1" if force else "0"], cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_args(ap)
    ap.add_argument("--parts", default="2,4")
    ap.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "artifacts"))
    ap.add_argument("--reuse-download", action="store_true", help="do not regenerate the graph if cached")
    args = ap.parse_args()
    dl_params = download_params(args)
    rows = []
    dl = run_stage(args.root, "download", dl_params, 1, force=not args.reuse_download)
    size = dl["bytes_graph"] + dl["bytes_features"]
    rows.append({"stage": "download (generate)", "parts": "-", "wall_s": dl["wall_s"],
                 "peak_rss_GiB": round(dl["peak_rss_bytes"] / 2**30, 2)})
    print(json.dumps({"stage": "download", "nodes": dl["num_nodes"], "edges": dl["num_edges"],
                      "graph_plus_features_GiB": round(size / 2**30, 2), "wall_s": dl["wall_s"],
                      "peak_rss_GiB": round(dl["peak_rss_bytes"] / 2**30, 2)}), flush=True)
    for parts in map(int, args.parts.split(",")):
        pt = run_stage(args.root, "partition", dl_params, parts, force=True)
        ft = run_stage(args.root, "features", dl_params, parts, force=True)
        for name, s in (("partition", pt), ("features", ft)):
            extra = ({"edge_cut_fraction": s["edge_cut_fraction"], "imbalance": s["imbalance"]}
                     if name == "partition" else {})
            print(json.dumps({"stage": name, "parts": parts, "wall_s": s["wall_s"],
                              "peak_rss_GiB": round(s["peak_rss_bytes"] / 2**30, 2),
                              "peak_over_data": round(s["peak_rss_bytes"] / size, 2), **extra}), flush=True)
            rows.append({"stage": name, "parts": parts, "wall_s": s["wall_s"],
                         "peak_rss_GiB": round(s["peak_rss_bytes"] / 2**30, 2)})
        print(json.dumps({"parts": parts, "partition_plus_features_s": round(pt["wall_s"] + ft["wall_s"], 1),
                          "goal_s": 300, "max_peak_over_data": round(max(pt["peak_rss_bytes"],
                                                                         ft["peak_rss_bytes"]) / size, 2),
                          "goal_ratio": 3.0}), flush=True)
    print("\n| stage | parts | wall s | peak RSS GiB |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['parts']} | {r['wall_s']:.1f} | {r['peak_rss_GiB']:.2f} |")


if __name__ == "__main__":
    main()
