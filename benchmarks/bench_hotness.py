"""Hit-rate curves of the hotness cache plan vs a degree-ranked cache on the products-scale synthetic graph.

Runs the real download → partition → features → hotness stages (cached under --root, so after
bench_pipeline.py only partition/features for new part counts and hotness run) and prints the curves.

    python benchmarks/bench_hotness.py --parts 2 --fanouts 15,10,5 --batch-size 1024
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _graph_args import add_graph_args, download_params  # benchmarks/ is on sys.path when run as a script

from stages.download import stage as download
from stages.features import stage as features
from stages.hotness import stage as hotness
from stages.partition import stage as partition
from storage import ArtifactStore
from storage.hotness import CURVE_PNG
from storage.summaries import HotnessSummary

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_args(ap)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "artifacts"))
    ap.add_argument("--png", default=None, help="copy the curve PNG here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    store = ArtifactStore(args.root)
    dl = download.run(store, download.Params(**download_params(args)), {})
    pt = partition.run(store, partition.Params(num_partitions=args.parts), {"download": dl})
    ft = features.run(store, features.Params(), {"download": dl, "partition": pt})
    params = hotness.Params(fanouts=tuple(int(f) for f in args.fanouts.split(",")), batch_size=args.batch_size,
                            epochs=args.epochs)
    m = hotness.run(store, params, {"partition": pt, "features": ft}, force=True)
    s = HotnessSummary.from_json(m.summary)
    print(json.dumps({"parts": args.parts, "fanouts": s.fanouts, "wall_s": s.wall_s,
                      "peak_rss_GiB": round(s.peak_rss_bytes / 2**30, 2)}))
    for row in s.parts:
        print(json.dumps(row))
    print("\n| part | cache % of part rows | hotness hit % | degree hit % | gain (points) | ceiling hit % |"
          "\n|---|---|---|---|---|---|")
    for c in s.curves:
        for f, h, d, top in zip(c["fraction"], c["hotness"], c["degree"], c["ceiling"]):
            print(f"| {c['part']} | {100 * f:g} | {100 * h:.2f} | {100 * d:.2f} | {100 * (h - d):+.2f} | "
                  f"{100 * top:.2f} |")
    if args.png:
        Path(args.png).write_bytes(store.read_bytes("hotness", m.key, CURVE_PNG))


if __name__ == "__main__":
    main()
