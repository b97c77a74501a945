"""Forward + backward of ONE products-scale training batch: the whole-batch path against the block path, and both
against the FLOP bound measured on the same machine in the same run.

The batch: our sampler on the pipeline's synthetic graph (``generate_synthetic(2_400_000, avg_degree=50, ...)``,
cached as ``--graph``, the file ``make bench`` writes), fanouts [15, 10, 5], 1024 seeds; features are random (their
values do not change the work). The model: built-in SAGE 3x256 (``build_model("sage")``), training mode (dropout
0.5), cross-entropy on random labels. Paths, the same weights:

- ``whole``: PyG's ``BasicGNN.forward`` with ``trim_to_layer`` (the path before [2/7]): layer 0 over every sampled
  node;
- ``block``: ``seed_logits`` on the built-in block model (``stages/train/models/blocks.py``): each layer over the rows
  the next one needs;
- ``block_bf16``: the same with ``precision="bfloat16"`` (``train.precision``: autocast of the products).

All run with big tensors on transparent huge pages, as the train stage starts its ranks
(``stages/jobs/host_memory.py``); ``--no-huge-pages`` measures without.

Dense GFLOP of the batch (the FLOP bound's numerator), SAGE layer l with ``n_l`` targets, ``c_in -> c_out``: two
GEMMs (``lin_l`` on the mean, ``lin_r`` on the root) of ``2 n_l c_in c_out`` FLOP each; the backward repeats them
for the weight gradients and, above layer 0 (the features need no gradient), for the input gradients::

    GFLOP = sum_l 4 n_l c_in c_out * (2 if l == 0 else 3) / 1e9

The sparse aggregation (sampled edges x channels additions, 0.1 GFLOP) is left out. The bound is that GFLOP over
the best sgemm rate measured here (``torch.mm`` on the batch's own layer shapes and a square 2048 one), in this
run, taking turns with the timed steps. Prints a table; appends JSON lines to ``--out``::

    .venv/bin/python benchmarks/bench_batch.py --graph benchmarks/work/products_pipeline.npz --threads 2

``--accuracy`` instead trains the default recipe on the default synthetic graph through the whole-batch path and
the block path in float32 and bfloat16, and prints the test accuracies (accuracy must not drop).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from _graph_args import add_graph_args  # noqa: E402 - after benchmarks/ is on sys.path
from bench_sampler import load_graph  # noqa: E402

from stages.jobs.host_memory import THP_ENV, huge_page_env  # noqa: E402 - torch-free

PATHS = ("whole", "block", "block_bf16")


def dense_gflop(layer_rows: list[int], channels: list[int]) -> float:
    """The module docstring's formula; ``channels`` = [in, hidden, ..., out]."""
    return sum(4 * n * c_in * c_out * (2 if layer == 0 else 3)
               for layer, (n, c_in, c_out) in enumerate(zip(layer_rows, channels[:-1], channels[1:]))) / 1e9


def sgemm_step(m: int, k: int, n: int):
    """A ``torch.mm`` of [m, k] @ [k, n] float32 into a written buffer (the GEMM alone, without the page faults of a
    new output), and its FLOP."""
    import torch

    a, b, c = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    return (lambda: torch.mm(a, b, out=c)), 2 * m * k * n


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_paths(paths: dict, gemms: dict, rounds: int, whole_rounds: int) -> tuple[list[dict], dict[str, float]]:
    """Seconds per forward + backward of each path (one untimed warm-up each), wall and process CPU time, and the
    best GFLOP/s of each GEMM. The paths and the GEMMs take turns, once each per round, so that other tenants'
    load falls on all of them alike."""
    for run, _ in paths.values():
        run()
    walls: dict[str, list[float]] = {name: [] for name in paths}
    cpus: dict[str, list[float]] = {name: [] for name in paths}
    rates = {name: 0.0 for name in gemms}
    for r in range(rounds):
        for name, (run, is_whole) in paths.items():
            if is_whole and r >= whole_rounds:
                continue
            cpu = time.process_time()
            walls[name].append(_timed(run))
            cpus[name].append(time.process_time() - cpu)
        for name, (gemm, flop) in gemms.items():
            rates[name] = max(rates[name], flop / _timed(gemm) / 1e9)
    return [{"path": name, "reps": len(walls[name]), "s_per_batch": round(float(np.median(walls[name])), 3),
             "min_s": round(min(walls[name]), 3), "cpu_s_per_batch": round(float(np.median(cpus[name])), 3),
             "walls": [round(w, 3) for w in walls[name]]} for name in paths], rates


def accuracy_check(args: argparse.Namespace) -> None:
    """Accuracy holds: the default recipe (SAGE 3x256, fanouts [15, 10, 5], batch 1024, Adam 0.003, dropout 0.5,
    10 epochs) on the default synthetic graph (the download stage's defaults), in one process, through the paths:
    PyG's plain model on the whole batch, the block model in float32 and in bfloat16. Prints test accuracies."""
    import torch
    from torch_geometric.nn.models import GraphSAGE

    from stages.download.synthetic import generate_synthetic
    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
    from stages.train.models.model import build_model
    from stages.train.rank.loop import eval_sums, train_epoch
    from stages.train.tasks import NodeClassification

    torch.set_num_threads(args.threads)
    graph = generate_synthetic(100_000, 20.0, 64, 16, seed=0)
    csr, x = LocalCSR.from_numpy(graph.indptr, graph.indices), torch.from_numpy(graph.x).float()
    y = torch.from_numpy(graph.y).long()
    split = {name: torch.from_numpy(gid).long() for name, gid in graph.splits.items()}
    cpu = torch.device("cpu")
    for path, precision in (("whole", "float32"), ("block", "float32"), ("block_bf16", "bfloat16")):
        torch.manual_seed(0)
        model = build_model("sage", in_channels=64, hidden=256, out_channels=16, num_layers=3, dropout=0.5)
        if path == "whole":   # PyG's own class, the same weights: not a block model, so seed_logits runs it whole
            plain = GraphSAGE(64, 256, 3, 16, dropout=0.5)
            plain.load_state_dict(model.state_dict())
            model = plain
        task = NodeClassification(lambda s: y.index_select(0, s), split, precision=precision)
        sampler = NeighborSampler(csr, [15, 10, 5], generator=torch.Generator().manual_seed(0))
        gen, opt = torch.Generator().manual_seed(1), torch.optim.Adam(model.parameters(), lr=0.003)
        start = time.perf_counter()
        for _ in range(10):
            train_epoch(model, opt, iter_seed_batches(split["train"], 1024, generator=gen), sampler.sample,
                        lambda n_id: x.index_select(0, n_id), task, num_real_batches=1 << 30, device=cpu)
        test = task.metric(eval_sums(model, iter_seed_batches(split["test"], 4096, generator=gen), sampler.sample,
                                     lambda n_id: x.index_select(0, n_id), task))
        row = {"bench": "batch_accuracy", "path": path, "test_acc": round(test, 4),
               "train_s": round(time.perf_counter() - start, 1), "threads": args.threads}
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as out:
            out.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_graph_args(ap)
    ap.add_argument("--graph", default=str(HERE / "work" / "products_pipeline.npz"),
                    help=".npz cache of the graph (read if it exists, else generated and written)")
    ap.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[15, 10, 5])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7, help="timed rounds of the block paths")
    ap.add_argument("--whole-reps", type=int, default=2, help="of the whole-batch path (about 20 s each)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"some of {', '.join(PATHS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results_batch.jsonl"))
    ap.add_argument("--accuracy", action="store_true", help="instead: train the default recipe on the default "
                                                            "synthetic graph through each path (~10 min)")
    ap.add_argument("--no-huge-pages", action="store_true", help="4 KiB pages for the big tensors (before [2/7])")
    args = ap.parse_args()
    # before the first CPU tensor, which is when torch reads the switch (stages/jobs/host_memory.py)
    os.environ.update({THP_ENV: "0"} if args.no_huge_pages else huge_page_env())
    if args.accuracy:
        accuracy_check(args)
        return

    import torch
    import torch.nn.functional as F

    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.sampler import NeighborSampler
    from stages.train.models.model import build_model, seed_logits

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    indptr, indices = load_graph(argparse.Namespace(graph=args.graph, from_partition=None, generator="pipeline",
                                                    nodes=args.nodes, avg_degree=args.avg_degree, seed=0))
    csr = LocalCSR.from_numpy(indptr, indices)
    gen = torch.Generator().manual_seed(args.seed)
    seed_gid = torch.randperm(csr.num_nodes, generator=gen)[:args.batch_size]
    batch = NeighborSampler(csr, args.fanouts, generator=gen).sample(seed_gid)
    x = torch.randn(batch.num_nodes, args.features, generator=gen)
    y = torch.randint(0, args.classes, (args.batch_size,), generator=gen)
    num_layers = len(args.fanouts)
    torch.manual_seed(args.seed)
    model = build_model("sage", in_channels=args.features, hidden=args.hidden, out_channels=args.classes,
                        num_layers=num_layers, dropout=args.dropout).train()

    nodes = np.cumsum(batch.num_sampled_nodes)
    layer_rows = [int(nodes[num_layers - 1 - layer]) for layer in range(num_layers)]
    channels = [args.features] + [args.hidden] * (num_layers - 1) + [args.classes]
    gflop = dense_gflop(layer_rows, channels)

    def step(forward) -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(forward(), y).backward()

    def whole():
        out = model(x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                    num_sampled_edges_per_hop=batch.num_sampled_edges)
        return out[:batch.batch_size]

    def block_bf16():
        return seed_logits(model, x, batch, precision="bfloat16")

    def block():
        return seed_logits(model, x, batch)

    forwards = {"whole": whole, "block": block, "block_bf16": block_bf16}
    paths = {name: (lambda f=forwards[name]: step(f), name == "whole") for name in args.paths.split(",")}
    shapes = [(layer_rows[0], args.features, args.hidden), (layer_rows[1], args.hidden, args.hidden),
              (2048, 2048, 2048)]
    gemms = {f"{m}x{k}x{n}": sgemm_step(m, k, n) for m, k, n in shapes}
    rows, rates = time_paths(paths, gemms, args.reps, args.whole_reps)
    best_rate = max(rates.values())
    bound_s = gflop / best_rate
    common = {"bench": "batch", "huge_pages": os.environ[THP_ENV] == "1", "nodes": int(batch.num_nodes),
              "edges": int(batch.edge_index.shape[1]),
              "layer_rows": layer_rows, "gflop": round(gflop, 2), "sgemm_gflops": {k: round(v, 1) for k, v in
                                                                                   rates.items()},
              "bound_s": round(bound_s, 3), "threads": args.threads,
              "loadavg_start": [round(v, 2) for v in load_start], "loadavg_end": [round(v, 2) for v in
                                                                                   os.getloadavg()]}
    base = next((r for r in rows if r["path"] == "whole"), None)
    print(f"batch: {common['nodes']} nodes, {common['edges']} edges, layer rows {layer_rows}; {gflop:.1f} dense "
          f"GFLOP; sgemm {', '.join(f'{k}: {v:.0f}' for k, v in rates.items())} GFLOP/s -> bound {bound_s:.3f} s")
    print("median and best of the rounds (a shared box: the best is the least disturbed step)")
    print(f"{'path':16s} {'s/batch':>8s} {'best s':>7s} {'cpu s':>7s} {'speedup':>8s} {'best':>6s} {'x bound':>8s} "
          f"{'best':>6s}")
    with open(args.out, "a") as out:
        for row in rows:
            row.update(common, ratio_to_bound=round(row["s_per_batch"] / bound_s, 2),
                       min_ratio_to_bound=round(row["min_s"] / bound_s, 2),
                       speedup=round(base["s_per_batch"] / row["s_per_batch"], 2) if base else None,
                       min_speedup=round(base["min_s"] / row["min_s"], 2) if base else None)
            print(f"{row['path']:16s} {row['s_per_batch']:8.3f} {row['min_s']:7.3f} {row['cpu_s_per_batch']:7.3f} "
                  f"{row['speedup'] or float('nan'):8.2f} {row['min_speedup'] or float('nan'):6.2f} "
                  f"{row['ratio_to_bound']:8.2f} {row['min_ratio_to_bound']:6.2f}")
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
