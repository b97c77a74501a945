"""Peer: PyG's ``NeighborLoader`` on the same graph, seeds and fanouts as ``bench_sampler.py``.

It needs pyg-lib or torch-sparse (``make bench-peer`` builds torch-sparse and torch-scatter from source, ~20 min).
Prints one JSON line in the same format as bench_sampler.py.

    python benchmarks/bench_peer_pyg.py --graph benchmarks/work/products_pipeline.npz --batches 30 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", required=True, help=".npz with indptr/indices (made by bench_sampler.py --graph)")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

    if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
        sys.exit("error: PyG's NeighborLoader needs pyg-lib or torch-sparse; run `make bench-peer` to build them")
    torch.set_num_threads(args.threads)
    with np.load(args.graph) as z:
        indptr, indices = z["indptr"], z["indices"]
    num_nodes = indptr.shape[0] - 1
    dst_gid = np.repeat(np.arange(num_nodes), np.diff(indptr))
    data = Data(edge_index=torch.from_numpy(np.stack([indices, dst_gid])), num_nodes=num_nodes)
    need = (args.batches + args.warmup) * args.batch_size
    train_gid = np.random.default_rng(args.seed).permutation(num_nodes)[:need]   # as bench_sampler's _train_gid
    loader = NeighborLoader(data, num_neighbors=[int(f) for f in args.fanouts.split(",")],
                            batch_size=args.batch_size, input_nodes=torch.from_numpy(train_gid), shuffle=False)
    edges, batch_s, it = 0, [], iter(loader)
    for _ in range(args.warmup):
        next(it)
    cpu_start = time.process_time()
    for _ in range(args.batches):
        start = time.perf_counter()
        batch = next(it)
        batch_s.append(time.perf_counter() - start)
        edges += batch.edge_index.shape[1]
    cpu_s, wall_s = time.process_time() - cpu_start, sum(batch_s)
    print(json.dumps({"peer": "torch_geometric.loader.NeighborLoader", "pyg_lib": WITH_PYG_LIB,
                      "torch_sparse": WITH_TORCH_SPARSE, "batches_per_s": round(args.batches / wall_s, 3),
                      "sampled_edges_per_s": round(edges / wall_s), "sampled_edges_per_cpu_s": round(edges / cpu_s),
                      "s_per_batch": round(wall_s / args.batches, 4), "edges_per_batch": round(edges / args.batches)}))


if __name__ == "__main__":
    main()
