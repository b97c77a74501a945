"""Feature rows to the GPU three ways, side by side: gather-then-copy, zero-copy (UVA), and the HBM cache.

Issue [7/7] item 4: does a zero-copy gather of pinned host rows beat gather-then-copy? The store is ``--rows`` x
``--cols`` in each ``--dtypes`` (page-locked, as ``open_feature_store(pin=True)`` loads it); a batch asks for
``--batch-rows`` random rows (with repeats, as a sampled batch's ``n_id`` of a products batch, ~650 k rows, does).

- ``copy``: ``index_select`` on the CPU into a pinned staging buffer, one async copy, wait (``DistFeatures``' path);
- ``uva``: the device gathers from the pinned store in place (``stages.runtime.uva.UvaRows``);
- ``hbm``: the same gather from a copy of the store in device memory (what a cached row costs; the upper bound).

Prints one JSON line: milliseconds per batch (median of ``--repeats`` after a warm-up) and effective GB/s of row
bytes delivered. Without CUDA it times only the CPU gather (``--allow-cpu``) or says so and exits 0::

    python benchmarks/bench_gpu_gather.py --rows 2400000 --cols 100 --batch-rows 650000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.runtime.uva import UvaRows, UvaUnavailableError  # noqa: E402 - after the repo is on sys.path

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8}


def _median_ms(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _store(rows: int, cols: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    x = torch.empty((rows, cols), dtype=dtype, pin_memory=pin)
    if dtype.is_floating_point:
        x.normal_()
    else:
        x.random_(-127, 128)
    return x


def bench_dtype(args: argparse.Namespace, dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    cuda = device.type == "cuda"
    x = _store(args.rows, args.cols, dtype, pin=cuda)
    gen = torch.Generator().manual_seed(0)
    lid = torch.randint(0, args.rows, (args.batch_rows,), generator=gen)
    row_bytes = args.cols * x.element_size()
    out: dict[str, object] = {"row_bytes": row_bytes}
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    staging = torch.empty((args.batch_rows, args.cols), dtype=dtype, pin_memory=cuda)

    def copy() -> torch.Tensor:
        rows = torch.index_select(x, 0, lid, out=staging)
        return rows.to(device, non_blocking=True) if cuda else rows

    ms = {"copy": _median_ms(copy, sync, args.repeats)}
    if cuda:
        lid_dev = lid.to(device)
        try:
            uva = UvaRows(x, device)
            if not torch.equal(uva.gather(lid_dev[:1000]).cpu(), x.index_select(0, lid[:1000])):
                raise UvaUnavailableError("the device view returned other rows than the host store holds")
            ms["uva"] = _median_ms(lambda: uva.gather(lid_dev), sync, args.repeats)
        except UvaUnavailableError as err:
            out["uva_error"] = str(err)
        x_dev = x.to(device)
        ms["hbm"] = _median_ms(lambda: x_dev.index_select(0, lid_dev), sync, args.repeats)
        del x_dev
    batch_bytes = args.batch_rows * row_bytes
    out["ms"] = {k: round(v, 3) for k, v in ms.items()}
    out["GB_per_s"] = {k: round(batch_bytes / (v / 1e3) / 1e9, 2) for k, v in ms.items()}
    if "uva" in ms:
        out["faster_host_path"] = "uva" if ms["uva"] < ms["copy"] else "copy"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_400_000)
    ap.add_argument("--cols", type=int, default=100)
    ap.add_argument("--batch-rows", type=int, default=650_000)
    ap.add_argument("--dtypes", default="float32,float16,int8", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for the copy path (default: torch's)")
    ap.add_argument("--allow-cpu", action="store_true", help="without CUDA, time the CPU gather alone")
    args = ap.parse_args()
    unknown = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if unknown:
        print(f"error: unknown dtype {unknown[0]!r}; choose from {', '.join(DTYPES)}", file=sys.stderr)
        sys.exit(2)
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("bench_gpu_gather: no CUDA device here; nothing to measure (--allow-cpu times the CPU gather)")
        return
    device = torch.device("cuda" if cuda else "cpu")
    result: dict[str, object] = {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
                                 "rows": args.rows, "cols": args.cols, "batch_rows": args.batch_rows,
                                 "threads": torch.get_num_threads()}
    result["dtypes"] = {name: bench_dtype(args, DTYPES[name], device) for name in args.dtypes.split(",")}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
