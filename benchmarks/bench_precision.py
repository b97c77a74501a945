"""Low-precision feature stores (issue [7/7], docs/design.md §6): what each ``features.dtype`` saves and what it costs.

For each storage dtype, through the real stages on 2 partitions (download → partition → features → hotness →
train, gloo ranks on CPU): bytes of the features artifact on disk, host RAM of the two ranks' stores, the cache rows
a fixed byte budget buys, the remote feature bytes an epoch moves, the decode error against the float32 rows, and
test accuracy (test at the best validation epoch) over several seeds against float32. Two graphs:

- ``synthetic``: the default pipeline graph (100 000 nodes, avg degree 20, 64 float32 features, 16 classes),
  GraphSAGE 2 x 64 with fanouts (10, 5), batches of 1 024, 20 epochs at lr 0.01, 1 MiB cache per rank;
- ``citeseer``: ``../shared/data/citeseer`` with the published GCN recipe of ``tests/_citeseer_recipe.py``
  (l1-normalised rows, 200 epochs, every neighbour), 256 KiB cache per rank.

``--bits``: where the accuracy cost starts, past the storage dtypes: each column of the stored float32 rows (after
l1 on CiteSeer) rounded to ``2^bits`` levels evenly spaced between its min and max (int8's rule with fewer steps),
written as a ``files`` dataset and trained in float32 with the same recipe.

``--decode``: instead, what a batch's gather and decode cost on the CPU per dtype: a products-scale batch (654 k
rows of 100 columns from a 1.2 M-row store, as ``benchmarks/bench_feature_checks.py``), ``index_select`` of the
stored rows then ``FeatureCodec.decode`` to float32; best of 5, ``--threads`` torch threads.

Prints one JSON line per run (appended to ``--out``), then a markdown table. The box is shared: the load average is
recorded beside each run. Runs are cached in ``--root`` (a second call is a lookup)::

    python benchmarks/bench_precision.py --graphs synthetic,citeseer --seeds 0,1,2
    python benchmarks/bench_precision.py --graphs synthetic,citeseer --seeds 0,1 --bits 4,2,1
    python benchmarks/bench_precision.py --decode --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, get_args

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stages.choices import FeatureDtype  # noqa: E402 - after the repo is on sys.path
from stages.features.normalize import normalize_rows  # noqa: E402
from stages.runtime.feature_codec import FeatureCodec  # noqa: E402
from stages.runtime.feature_store import open_part_store  # noqa: E402
from storage import ArtifactStore, Manifest  # noqa: E402
from storage.features import FeaturesArtifact  # noqa: E402
from storage.graph import GraphArtifact  # noqa: E402
from storage.hotness import HotnessArtifact  # noqa: E402
from storage.partition import PartitionArtifact  # noqa: E402
from storage.train_summary import TrainSummary  # noqa: E402
from tests._citeseer_recipe import CITESEER, citeseer_config  # noqa: E402
from tests._download_cases import write_files  # noqa: E402
from tests._train_pipeline import build_without_prefect  # noqa: E402

DTYPES = tuple(d for d in get_args(FeatureDtype) if d != "auto")   # auto is float32 for these float rows
PARTS = 2
SYNTHETIC: dict[str, Any] = {"dataset": "synthetic", "fanouts": (10, 5), "hidden": 64, "batch_size": 1024,
                             "epochs": 20, "lr": 0.01, "threads_per_rank": 1, "cache_budget_bytes": 1 << 20}
CITESEER_CACHE = 256 << 10


def config(graph: str, dtype: str, seed: int, root: str) -> dict[str, Any]:
    """The pipeline config; ``seed`` is the training's only (the graph and the cache plan stay the same)."""
    if graph == "citeseer":
        values = citeseer_config(PARTS, root, dtype=dtype, cache_budget_bytes=CITESEER_CACHE)
        values.pop("seed")   # the recipe's 0, every stage's default
    else:
        values = {**SYNTHETIC, "artifacts": root, "num_partitions": PARTS, "dtype": dtype}
    return {**values, "train.seed": seed}


def coarse_levels(x: np.ndarray, bits: int) -> np.ndarray:
    """Each column rounded to ``2^bits`` levels evenly spaced between its min and max (float32)."""
    lo, hi = x.min(axis=0), x.max(axis=0)
    step = np.where(hi > lo, (hi - lo) / (2**bits - 1), 1.0)
    return (np.round((x - lo) / step) * step + lo).astype(np.float32)


def run_bits(graph: str, bits: int, seed: int, root: str) -> dict[str, Any]:
    """The float32 recipe on the graph whose stored rows were rounded to ``2^bits`` levels a column."""
    store, manifests = build_without_prefect({**config(graph, "float32", 0, root), "until": "download"})
    g = GraphArtifact(store, manifests["download"]).read()
    assert g.x is not None
    x = normalize_rows(g.x, "l1" if graph == "citeseer" else "none")
    path = write_files(Path(root) / f"files-{graph}-{bits}bit", g, coarse_levels(x, bits))
    values = {**config(graph, "float32", seed, root), "dataset": "files", "path": str(path), "normalize": "none"}
    load_before = os.getloadavg()[0]
    _, manifests = build_without_prefect({**values, "until": "train"})
    s = manifests["train"].summary
    return {"graph": graph, "bits": bits, "seed": seed, "test_acc": TrainSummary.from_json(s).test_metric,
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def decode_cost(threads: int, store_rows: int = 1_200_000, batch_rows: int = 654_000, cols: int = 100,
                repeat: int = 5) -> list[dict[str, Any]]:
    """Best-of-``repeat`` seconds to gather a batch's stored rows and decode them, per dtype."""
    from stages.features.schemes import encode_rows, fit_codec

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(store_rows, cols)).astype(np.float32)
    lid = torch.from_numpy(rng.integers(0, store_rows, batch_rows))
    out = []
    for dtype in DTYPES:
        codec = fit_codec(x, dtype, "none")
        codes = codec.held(encode_rows(x, codec, np.arange(store_rows)))
        times = {"gather": float("inf"), "gather_decode": float("inf")}
        for _ in range(repeat):
            start = time.perf_counter()
            rows = torch.index_select(codes, 0, lid)
            mid = time.perf_counter()
            codec.decode(rows)
            end = time.perf_counter()
            times["gather"] = min(times["gather"], mid - start)
            times["gather_decode"] = min(times["gather_decode"], end - start)
        out.append({"bench": "decode", "dtype": dtype, "threads": threads, "batch_rows": batch_rows, "cols": cols,
                    "gather_ms": round(1e3 * times["gather"], 1),
                    "gather_decode_ms": round(1e3 * times["gather_decode"], 1),
                    "loadavg_1m": round(os.getloadavg()[0], 2)})
        del codes
    return out


def store_figures(store: ArtifactStore, manifests: dict[str, Manifest]) -> dict[str, Any]:
    """Disk, host RAM, cache rows and the decode error of one features build (no training)."""
    features = FeaturesArtifact(store, manifests["features"])
    x = GraphArtifact(store, manifests["download"]).read().x
    assert x is not None
    book = PartitionArtifact(store, manifests["partition"]).book()
    stores = [open_part_store(features, p, memory_budget_bytes=1 << 40) for p in range(PARTS)]
    ram = sum(s.x.untyped_storage().nbytes() for s in stores)   # type: ignore[attr-defined]
    codes = torch.cat([s.gather(torch.arange(s.num_rows)) for s in stores])
    want = normalize_rows(x[book.orig_of_gid], manifests["features"].summary["normalize"]).astype(np.float32)
    err = np.abs(FeatureCodec.of(features.scheme(0)).decode(codes).numpy() - want)
    nonzero = want != 0
    plans = [HotnessArtifact(store, manifests["hotness"]).plan(p).attrs for p in range(PARTS)]
    return {"disk_bytes": manifests["features"].bytes, "ram_bytes": ram, "row_bytes": features.row_bytes,
            "cache_rows": sum(int(a["plan_rows"]) for a in plans),
            "max_abs_err": float(err.max()),
            "mean_rel_err": float((err[nonzero] / np.abs(want[nonzero])).mean()) if nonzero.any() else 0.0}


def run_one(graph: str, dtype: str, seed: int, root: str) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    store, manifests = build_without_prefect({**config(graph, dtype, seed, root), "until": "train"})
    wall = time.perf_counter() - start
    s = manifests["train"].summary
    return {"graph": graph, "dtype": dtype, "seed": seed, **store_figures(store, manifests),
            "remote_rows_per_epoch": sum(e["remote_rows"] for e in s["epochs"]) / len(s["epochs"]),
            "remote_bytes_per_epoch": s["remote_bytes_per_epoch"],
            "test_acc": TrainSummary.from_json(s).test_metric,
            "train_s_per_epoch": sum(e["epoch_s"] for e in s["epochs"]) / len(s["epochs"]),
            "wall_s": round(wall, 1), "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "cpus": os.cpu_count()}


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| graph | dtype | disk MiB | host RAM MiB | cache rows (fixed bytes) | remote MiB/epoch | "
           "max abs err | mean rel err | test % (seeds) | Δ vs float32 (points) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["graph"], r["dtype"]), []).append(r)
    for (graph, dtype), rs in groups.items():
        acc = [100 * r["test_acc"] for r in rs]
        base = {r["seed"]: 100 * r["test_acc"] for r in groups.get((graph, "float32"), [])}
        delta = [100 * r["test_acc"] - base[r["seed"]] for r in rs if r["seed"] in base]
        first = rs[0]
        shift = f"{np.mean(delta):+.2f} [{min(delta):+.1f}, {max(delta):+.1f}]" if delta else "-"
        out.append(f"| {graph} | {dtype} | {first['disk_bytes'] / 2**20:.2f} | {first['ram_bytes'] / 2**20:.2f} | "
                   f"{first['cache_rows']:,} | {np.mean([r['remote_bytes_per_epoch'] for r in rs]) / 2**20:.2f} | "
                   f"{first['max_abs_err']:.2g} | {first['mean_rel_err']:.2g} | "
                   f"{np.mean(acc):.1f} [{min(acc):.1f}-{max(acc):.1f}] | {shift} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="synthetic,citeseer")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--bits", default="", help="instead: the float32 recipe on rows rounded to 2^bits levels")
    ap.add_argument("--decode", action="store_true", help="instead: a batch's gather and decode, per dtype")
    ap.add_argument("--threads", type=int, default=2, help="--decode: torch threads")
    ap.add_argument("--root", default="/tmp/bench-precision", help="artifact root (runs are cached there)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results_precision.jsonl"))
    args = ap.parse_args()
    if args.decode:
        for row in decode_cost(args.threads):
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        return
    rows = []
    for graph in args.graphs.split(","):
        if graph == "citeseer" and not (CITESEER / "x.npy").exists():
            sys.exit(f"CiteSeer not found: {CITESEER} (../shared/data is absent in a user's clone)")
        for level in (args.bits.split(",") if args.bits else args.dtypes.split(",")):
            for seed in (int(s) for s in args.seeds.split(",")):
                row = run_bits(graph, int(level), seed, args.root) if args.bits else \
                    run_one(graph, level, seed, args.root)
                rows.append(row)
                line = json.dumps(row)
                print(line, flush=True)
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    if not args.bits:
        print(table(rows))


if __name__ == "__main__":
    main()
