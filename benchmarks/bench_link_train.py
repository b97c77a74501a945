"""Link prediction ([6/7]): the train stage on 2 ranks vs one process holding the whole graph, per positive edge.

    python benchmarks/bench_link_train.py --nodes 2400000 --avg-degree 50 --features 100 --classes 47 \
        --epochs 2 --root /tmp/bench-link

``synthetic-link`` (the products-like synthetic graph, 85/5/10 edge split), GraphSAGE 3 layers [15, 10, 5], hidden
256, the MLP decoder, 1 negative per training positive, ``--edges-per-epoch`` positives an epoch, 100 shared
negatives per valid/test positive over ``eval_edges`` = 10 000 of each. The 2-rank side is the real pipeline
(download → partition → features → hotness → train, cached in ``--root``); the baseline is the same model and loop
(``stages.train.rank.loop.train_epoch`` with ``LinkPrediction``) in one process over every partition's CSR and
features, with the machine's cores as torch threads, timed over the same number of positives. One JSON line:
seconds per 1 000 positives on both sides and their ratio (the issue's goal: <= 1.3), sampled edges/s, the
2-rank run's epoch times and test MRR / Hits@K / AUC.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _graph_args import add_graph_args  # benchmarks/ is on sys.path when run as a script

from storage.summaries import DownloadSummary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FANOUTS = (15, 10, 5)


def pipeline_values(args: argparse.Namespace) -> dict[str, Any]:
    return {"artifacts": args.root, "dataset": "synthetic-link", "task": "link", "num_nodes": args.nodes,
            "avg_degree": args.avg_degree, "num_features": args.features, "num_classes": args.classes,
            "num_partitions": 2, "fanouts": FANOUTS, "batch_size": args.batch_size, "hidden": args.hidden,
            "epochs": args.epochs, "edges_per_epoch": args.edges_per_epoch}


def single_process(args: argparse.Namespace, manifests: dict[str, Any]) -> dict[str, Any]:
    """The baseline: the same model and loop in this process, the whole graph and x in memory, no DDP."""
    import numpy as np
    import torch

    from stages.runtime.csr import LocalCSR
    from stages.runtime.negatives import NegativeDraws
    from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
    from stages.train.models.plugins import make_decoder, make_model
    from stages.train.rank.loop import train_epoch
    from stages.train.tasks.link import LinkModel, LinkPrediction
    from stages.train.tasks.link_decoders import link_loss
    from storage import ArtifactStore
    from storage.features import FeaturesArtifact
    from storage.graph import SPLITS
    from storage.partition import PartitionArtifact, concat_parts

    torch.set_num_threads(os.cpu_count() or 2)
    store = ArtifactStore(args.root)
    partition = PartitionArtifact(store, manifests["partition"])
    features = FeaturesArtifact(store, manifests["features"])
    parts = range(partition.num_partitions)
    csr = LocalCSR.from_numpy(*concat_parts([partition.csr(p) for p in parts]), start_gid=0)
    x = torch.from_numpy(np.concatenate([features.part(p).x for p in parts]))   # gid order: parts are ranges
    edges = {s: torch.from_numpy(np.concatenate([partition.edge_split(p, s) for p in parts], axis=1))
             for s in SPLITS}
    gen = torch.Generator().manual_seed(0)
    task = LinkPrediction(edges, NegativeDraws(x.shape[0]), gen, num_negatives=1, eval_negatives=100,
                          loss_fn=link_loss)
    torch.manual_seed(0)
    encoder = make_model("sage", {}, in_channels=x.shape[1], hidden=args.hidden, out_channels=args.hidden,
                         num_layers=len(FANOUTS), dropout=0.5, heads=1)
    model = LinkModel(encoder, make_decoder("mlp", args.hidden, 0.5))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    sampler = NeighborSampler(csr, FANOUTS, generator=gen)
    batches = iter_seed_batches(task.seeds("train"), args.batch_size, generator=gen, limit=args.edges_per_epoch)
    start = time.perf_counter()
    sums = train_epoch(model, optimizer, batches, sampler.sample, lambda n_id: x.index_select(0, n_id), task,
                       num_real_batches=1 << 30, device=torch.device("cpu"))
    wall = time.perf_counter() - start
    return {"threads": torch.get_num_threads(), "positives": sums.seeds, "epoch_s": round(wall, 1),
            "s_per_1k_positives": round(1000 * wall / sums.seeds, 3),
            "sampled_edges_per_s_M": round(sums.sampled_edges / wall / 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_graph_args(ap)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--edges-per-epoch", type=int, default=65_536)
    ap.add_argument("--root", default="/tmp/bench-link")
    ap.add_argument("--skip-single", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.root, exist_ok=True)

    from flows.direct import run_stages

    _, m = run_stages({**pipeline_values(args), "until": "train"})
    s = m["train"].summary
    positives = s["epochs"][-1]["train_items"]
    epoch_s = [e["epoch_s"] for e in s["epochs"]]
    dist = {"positives": positives, "epoch_s": [round(t, 1) for t in epoch_s],
            "s_per_1k_positives": round(1000 * min(epoch_s) / positives, 3),
            "sampled_edges_per_s_M": round(max(e["sampled_edges_per_s"] for e in s["epochs"]) / 1e6, 2),
            "eval_s": [round(e["eval_s"], 1) for e in s["epochs"]], "test": s["test_metrics"],
            "hit_rate": round(s["mean_hit_rate"], 4),
            "remote_MiB_per_epoch": round(s["remote_bytes_per_epoch"] / 2**20)}
    download = DownloadSummary.from_json(m["download"].summary)
    result: dict[str, Any] = {"nodes": download.num_nodes, "edges": download.num_edges,
                              "edge_splits": download.edge_split_sizes,
                              **{f"{stage}_s": round(m[stage].summary["wall_s"], 1)
                                 for stage in ("download", "partition", "features", "hotness")},
                              "dist_2_ranks": dist}
    if not args.skip_single:
        single = single_process(args, m)
        result["single_process"] = single
        result["ratio_per_positive"] = round(dist["s_per_1k_positives"] / single["s_per_1k_positives"], 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
