"""The two layer-wise inference paths side by side in one process: per-chunk gather against layer matrices + halo.

One rank (no process group, so no halo), a random graph with locality (each node's in-neighbours within n/20 lids,
like a METIS-ordered partition), Poisson(``--degree``) in-edges, a 3-layer model; both paths run the same model on
the same rows in the same process, and the largest output difference is printed (0 expected: the CSR rows sum the
same entries in the same order). Prints one JSON line per path.

    python benchmarks/bench_infer_paths.py --nodes 300000 --model sage
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.infer.layerwise import Inference  # noqa: E402
from stages.runtime.csr import LocalCSR  # noqa: E402
from stages.runtime.dist_features import DistFeatures  # noqa: E402
from stages.runtime.feature_store import InMemoryFeatureStore  # noqa: E402
from stages.train.models.model import build_model, needs_degrees  # noqa: E402
from stages.train.rank.rank_data import degree_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=300_000)
    ap.add_argument("--degree", type=int, default=50)
    ap.add_argument("--features", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--model", default="sage", choices=["sage", "gcn"])
    ap.add_argument("--chunk-edges", type=int, default=1 << 18)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, rng = args.nodes, np.random.default_rng(0)
    counts = rng.poisson(args.degree, n)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    dst_lid = np.repeat(np.arange(n), counts)
    src_lid = (dst_lid + rng.integers(-n // 20, n // 20, indptr[-1])) % n
    csr = LocalCSR.from_numpy(indptr, src_lid)
    x = torch.randn(n, args.features)
    model = build_model(args.model, in_channels=args.features, hidden=args.hidden, out_channels=47, num_layers=3,
                        dropout=0.0).eval()
    degrees = degree_path(csr, np.array([0, n]), torch.device("cpu")) if needs_degrees(model) else None
    outs = []
    for from_matrices in (False, True):
        engine = Inference(model, 3, csr, np.array([0, n]), degrees, args.chunk_edges)
        engine.from_matrices = from_matrices
        start = time.perf_counter()
        with torch.inference_mode():
            outs.append(engine.run(lambda: DistFeatures(InMemoryFeatureStore(x), [0, n]), [], lambda _l, _h: None))
        print(json.dumps({"path": engine.path, "nodes": n, "edges": int(indptr[-1]), "model": args.model,
                          "threads": args.threads, "wall_s": round(time.perf_counter() - start, 2),
                          "layer_s": [s.seconds for s in engine.stats]}), flush=True)
    print(json.dumps({"max_abs_diff": float((outs[0] - outs[1]).abs().max())}))


if __name__ == "__main__":
    main()
