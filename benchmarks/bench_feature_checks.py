"""What the feature dtypes cost: the download stage's finite check, and gathering a batch per storage dtype.

1. ``first_non_finite`` (``stages.download.canonical``) over a products-scale x (2 449 029 x 100 float32, 0.98 GB),
   in RAM and as the memory-mapped ``x.npy`` the ``files`` dataset reads (warm page cache).
2. A products-scale batch (654 k sampled rows of 100 columns, SAGE 3x256 with fanouts [15,10,5] and batch 1024) from
   a rank's 1.2 M-row store: ``index_select`` in each storage dtype, then the cast to float32 that
   ``NodeLoader.gather_rows`` does on the device. Best of 5, ``--threads`` torch threads.

    python benchmarks/bench_feature_checks.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from stages.download.canonical import first_non_finite


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def finite_check(rows: int, cols: int) -> list[dict]:
    rng = np.random.default_rng(0)
    x = np.empty((rows, cols), dtype=np.float32)
    for lo in range(0, rows, 1 << 18):
        x[lo:lo + (1 << 18)] = rng.standard_normal((min(1 << 18, rows - lo), cols), dtype=np.float32)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.npy"
        np.save(path, x)
        for where, arr in (("ram", x), ("mmap", np.load(path, mmap_mode="r"))):
            assert first_non_finite(arr) is None
            out.append({"bench": "finite_check", "where": where, "rows": rows, "cols": cols,
                        "GB": round(x.nbytes / 1e9, 3), "s": round(best_of(partial(first_non_finite, arr)), 4)})
    return out


def gather_cast(store_rows: int, batch_rows: int, cols: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    lid = torch.randint(0, store_rows, (batch_rows,), generator=gen)
    base = torch.randn(store_rows, cols, generator=gen) * 3
    out = []
    for dtype in (torch.float32, torch.float16, torch.uint8, torch.bool):
        x = base.to(dtype)
        rows = torch.index_select(x, 0, lid)
        gather_s = best_of(partial(torch.index_select, x, 0, lid))
        cast_s = best_of(partial(rows.to, torch.float32))
        out.append({"bench": "gather_cast", "dtype": str(dtype).removeprefix("torch."),
                    "row_bytes": cols * x.element_size(), "store_MiB": round(x.numel() * x.element_size() / 2**20),
                    "gather_ms": round(1e3 * gather_s, 1), "cast_ms": round(1e3 * cast_s, 1),
                    "total_ms": round(1e3 * (gather_s + cast_s), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_449_029, help="rows of x for the finite check")
    ap.add_argument("--cols", type=int, default=100)
    ap.add_argument("--store-rows", type=int, default=1_200_000, help="one rank's partition")
    ap.add_argument("--batch-rows", type=int, default=654_000, help="sampled nodes of one batch")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for row in finite_check(args.rows, args.cols) + gather_cast(args.store_rows, args.batch_rows, args.cols):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
