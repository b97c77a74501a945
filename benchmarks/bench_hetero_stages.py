"""Stage times and peak RSS of a typed graph through download → partition → features ([5/7]), the real stages
(Zarr writes included), one JSON line per number of parts.

    python benchmarks/bench_hetero_stages.py --nodes 1939743 --parts 2 4 --root /tmp/bench-hetero

``synthetic-hetero`` at ``--nodes 1939743`` has ogbn-mag's node counts (papers, authors, institutions, fields of
study) and about its edges (38.3 M stored at the default avg_degree 20, reverses included). The
download is built once and found cached by the second configuration. Each stage's wall time and peak RSS come from
its manifest (``stages.meter``: the kernel's high-water mark, reset per stage where Linux allows it).
"""

from __future__ import annotations

import argparse
import json
import os

from _graph_args import add_hetero_args, hetero_params  # benchmarks/ is on sys.path when run as a script

from flows.direct import run_stages
from storage.summaries import DownloadSummary, FeaturesSummary, PartitionSummary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_hetero_args(ap, nodes=1_939_743, parts=[2, 4], root="/tmp/bench-hetero")
    args = ap.parse_args()
    os.makedirs(args.root, exist_ok=True)
    for parts in args.parts:
        _, m = run_stages({**hetero_params(args, parts), "until": "features"})
        graph = DownloadSummary.from_json(m["download"].summary)
        part = PartitionSummary.from_json(m["partition"].summary)
        stages = {"download": graph, "partition": part, "features": FeaturesSummary.from_json(m["features"].summary)}
        typed = part.typed or {"node_types": {}, "edge_types": {}}
        print(json.dumps({
            "nodes": graph.num_nodes, "edges": graph.num_edges, "parts": parts,
            **{f"{stage}_s": s.wall_s for stage, s in stages.items()},
            **{f"{stage}_peak_GiB": round(s.peak_rss_bytes / 2**30, 2) for stage, s in stages.items()},
            "edge_cut_fraction": part.edge_cut_fraction, "imbalance": part.imbalance,
            "type_imbalance": {t: f["imbalance"] for t, f in typed["node_types"].items()},
            "cut_by_edge_type": {k: f["edge_cut_fraction"] for k, f in typed["edge_types"].items()},
        }), flush=True)


if __name__ == "__main__":
    main()
