"""Choose the feature store's chunk shape and codec by measurement.

For each (chunk rows, codec): write time, size on disk, whole-array load time (what a worker does at start-up)
and random 100 k-row gathers straight from Zarr (what an out-of-RAM partition would do), plus the in-RAM
``index_select(out=...)`` gather for reference. Prints one JSON line per configuration.

    python benchmarks/bench_features.py --rows 1200000 --cols 100
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import cast

import numpy as np
import torch

from storage.zarr_io import BloscCname, open_array, open_group, read_array, write_array


def features(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Dense float32 rows like the synthetic/product features: class centroid + noise."""
    rng = np.random.default_rng(seed)
    centroids = rng.normal(size=(47, cols)).astype(np.float32)
    labels = rng.integers(0, 47, rows)
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 2.0
    x += centroids[labels]
    return x


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_one(x: np.ndarray, workdir: Path, chunk_rows: int, codec: BloscCname | None, ids: list[np.ndarray]
              ) -> dict:
    url = str(workdir / f"x-{chunk_rows}-{codec}.zarr")
    t0 = time.perf_counter()
    write_array(open_group(url, mode="w"), "x", x, chunk_rows=chunk_rows, compressor=codec)
    write_s = time.perf_counter() - t0
    group = open_group(url)
    t0 = time.perf_counter()
    loaded = read_array(group, "x")
    load_s = time.perf_counter() - t0
    assert np.array_equal(loaded[:100], x[:100])
    arr = open_array(group, "x")
    t0 = time.perf_counter()
    for batch in ids:
        arr.oindex[np.sort(batch)]
    gather_s = (time.perf_counter() - t0) / len(ids)
    size = dir_bytes(Path(url))
    shutil.rmtree(url)
    return {"chunk_rows": chunk_rows, "codec": codec or "none", "MiB": round(size / 2**20, 1),
            "ratio": round(x.nbytes / size, 3), "write_s": round(write_s, 3), "load_s": round(load_s, 3),
            "load_GBps": round(x.nbytes / load_s / 1e9, 3), "zarr_gather_100k_s": round(gather_s, 3),
            "zarr_gather_Mrows_s": round(ids[0].shape[0] / gather_s / 1e6, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_200_000)
    ap.add_argument("--cols", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunks", default="8192,32768,65536,262144")
    ap.add_argument("--codecs", default="none,lz4,zstd")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    x = features(args.rows, args.cols)
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, args.rows, args.batch) for _ in range(args.repeats)]
    # reference: in-RAM gather into a reused buffer (what the runtime does after loading the partition)
    xt, out = torch.from_numpy(x), torch.empty(args.batch, args.cols)
    t0 = time.perf_counter()
    for batch in ids:
        torch.index_select(xt, 0, torch.from_numpy(batch), out=out)
    ram_s = (time.perf_counter() - t0) / len(ids)
    print(json.dumps({"reference": "torch.index_select(out=) in RAM", "gather_100k_s": round(ram_s, 5),
                      "Mrows_s": round(args.batch / ram_s / 1e6, 1)}), flush=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for name in args.codecs.split(","):
            codec = None if name == "none" else cast(BloscCname, name)   # Blosc refuses an unknown cname itself
            for chunk in map(int, args.chunks.split(",")):
                res = bench_one(x, Path(tmp), chunk, codec, ids)
                print(json.dumps({"rows": args.rows, "cols": args.cols, **res}), flush=True)


if __name__ == "__main__":
    main()
