"""Why a graphed training step's CSR products are slower than the eager step's: one products batch's forward and
backward, unpadded and padded to the static shape, eager and replayed from a captured CUDA graph, each on an
otherwise idle device.

Session 31's H200 check (benchmarks/RESULTS.md) profiled ``cusparse::csrmm_alg2_kernel`` at 3.56 ms a batch in
every graphed step against 0.35 ms in every eager one, while padding adds only ~10 % edges. The four cases here
separate the three suspects: the padded shape (unpadded vs padded, both eager), the capture (eager vs replayed, on
the same batch), and the sampling kernels that run beside the step in training (absent here: if every case is
near the eager figure, they are the cause). Prints one JSON line: per case the ms a step and, on a GPU, the CSR
products' and all kernels' ms a step (``torch.profiler``)::

    python3 benchmarks/bench_step_spmm.py --graph benchmarks/work/gpu/sampler-products.npz --device cuda
    .venv/bin/python benchmarks/bench_step_spmm.py --nodes 20000 --avg-degree 10 --device cpu   # the command

The graph is bench_sampler's (``--graph`` caches it; ``make gpu-check`` prepares the products one).
``--aggregate cusparse,index_add`` times each case with the step's CSR products as they are (cuSPARSE) and with
a gather and ``index_add_`` in their place (this script's own stand-in, one candidate should cuSPARSE be the cause);
``--precision tf32`` runs the GEMMs as the train stage's default does on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_sampler import add_graph_source_args, load_graph  # noqa: E402 - benchmarks/ is on sys.path when run as a script

CSR_KERNEL = "csrmm"   # cuSPARSE's CSR x dense kernels (csrmm_alg2_kernel on the H200)


def index_add_mm(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``a @ h`` for a CSR ``a`` by a gather of the entries' rows and ``index_add_`` into their rows: the
    sizes come from the tensors' shapes, so no value is read back (capturable)."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    row = torch.repeat_interleave(torch.arange(a.shape[0], device=h.device), torch.diff(crow),
                                  output_size=col.numel())
    h = h.to(val.dtype)
    out = torch.zeros((a.shape[0], h.shape[1]), dtype=h.dtype, device=h.device)
    return out.index_add_(0, row, h.index_select(0, col) * val.unsqueeze(1))


def batches(args: argparse.Namespace, device: torch.device) -> tuple[Any, Any, Any]:
    """One sampled batch, the same padded to the static shape, and the SAGE model they run through."""
    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.sampler import NeighborSampler
    from stages.runtime.sampling.static_shape import StaticShape
    from stages.train.models.model import build_model
    from stages.train.rank.static_batch import pad_batch

    indptr, indices = load_graph(args)
    csr = LocalCSR.from_numpy(indptr, indices, device=str(device))
    gen = torch.Generator(device=device).manual_seed(0)
    sampler = NeighborSampler(csr, args.fanouts, generator=gen)
    seeds = torch.randperm(csr.num_nodes, generator=torch.Generator().manual_seed(1))[:args.batch_size]
    batch = sampler.sample(seeds.to(device))
    shape = StaticShape.bound(args.batch_size, args.fanouts, csr.num_nodes)
    padded = pad_batch(batch, shape, shape.fake_edge_index(device))
    torch.manual_seed(0)
    model = build_model("sage", in_channels=args.features, hidden=args.hidden, out_channels=args.classes,
                        num_layers=len(args.fanouts), dropout=0.0).to(device)
    return batch, padded, model


def step_of(model: Any, batch: Any, x: torch.Tensor) -> Any:
    """forward and backward of ``model`` on ``batch`` (gradients set afresh each call, as the graphed step)."""
    from stages.train.models.model import seed_logits

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        seed_logits(model, x, batch).float().square().mean().backward()
    return step


def captured(step: Any, device: torch.device) -> Any:
    """``step`` captured into a CUDA graph after a warm-up on a side stream (PyTorch's whole-network recipe)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def measure(run: Any, device: torch.device, steps: int) -> dict[str, float]:
    """ms a step over ``steps`` runs after 3 warm-ups; on a GPU also the CSR products' and all kernels' ms."""
    for _ in range(3):
        run()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    out = {"ms_per_step": round((time.perf_counter() - start) / steps * 1e3, 3)}
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                run()
            sync()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        us = sum(e.device_time for e in kernels)
        csr_us = sum(e.device_time for e in kernels if CSR_KERNEL in e.name)
        out.update(kernel_ms=round(us / steps / 1e3, 3), csr_product_ms=round(csr_us / steps / 1e3, 3))
    return out


def time_cases(aggregate: str, model: Any, cases: Any, device: torch.device, steps: int,
               result: dict[str, Any]) -> None:
    """Each ``(name, batch, rows)`` of ``cases`` timed eager and replayed with the step's products as
    ``aggregate`` says (``AGGREGATES``), into ``result``; first, the largest difference of its logits from the
    step's own products on the first batch (``<aggregate>_max_abs_diff``)."""
    from stages.train.models import blocks
    from stages.train.models.model import seed_logits

    kept = blocks._sparse_mm
    _, batch, x = cases[0]
    with torch.no_grad():
        reference = seed_logits(model, x, batch)
    blocks._sparse_mm = AGGREGATES[aggregate] or kept   # the step's products, as they are or the stand-in
    try:
        with torch.no_grad():
            result[f"{aggregate}_max_abs_diff"] = float((seed_logits(model, x, batch) - reference).abs().max())
        for name, b, rows in cases:
            case = f"{name}/{aggregate}" if aggregate != "cusparse" else name
            step = step_of(model, b, rows)
            result["cases"][f"{case}/eager"] = measure(step, device, steps)
            result["cases"][f"{case}/replayed"] = (measure(captured(step, device), device, steps)
                                                   if device.type == "cuda" else
                                                   "skipped: a CPU cannot capture a CUDA graph")
    finally:
        blocks._sparse_mm = kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_source_args(ap)   # bench_sampler's graph (make gpu-check prepares the products one)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[15, 10, 5])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--features", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--classes", type=int, default=47)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--aggregate", default="cusparse", help="comma list of cusparse, index_add")
    ap.add_argument("--precision", choices=["float32", "tf32"], default="float32", help="the GEMMs' (tf32: "
                    "TensorFloat32 on a GPU, the train stage's default there)")
    args = ap.parse_args()
    if unknown := set(args.aggregate.split(",")) - AGGREGATES.keys():
        ap.error(f"--aggregate: unknown {sorted(unknown)}; choose from {', '.join(AGGREGATES)}")
    torch.set_float32_matmul_precision("high" if args.precision == "tf32" else "highest")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this host has no GPU (torch sees none); use --device cpu")
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    batch, padded, model = batches(args, device)
    x = torch.randn(batch.n_id.numel(), args.features, device=device)
    x_pad = torch.zeros(padded.num_nodes, args.features, device=device).index_copy_(0, padded.pad_pos, x)
    result: dict[str, Any] = {"device": str(device), "nodes": int(batch.n_id.numel()),
                              "edges": int(batch.edge_index.shape[1]), "padded_nodes": int(padded.num_nodes),
                              "padded_edges": int(padded.edge_index.shape[1]), "cases": {}}
    result["precision"] = args.precision
    for aggregate in args.aggregate.split(","):
        time_cases(aggregate, model, (("unpadded", batch, x), ("padded", padded, x_pad)), device, args.steps, result)
    print(json.dumps(result), flush=True)


# the step's CSR products: None, as they are (blocks._sparse_mm: cuSPARSE on a GPU); or this script's stand-in
AGGREGATES = {"cusparse": None, "index_add": index_add_mm}


if __name__ == "__main__":
    main()
