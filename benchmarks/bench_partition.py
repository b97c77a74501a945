"""Time and memory of the partition stage's computation at scale (no Zarr I/O): METIS, KaMinPar or random
assignment with balance repair, relabelling, and building every part's CSR. Prints one JSON line per method (and
KaMinPar thread count) and number of parts, then a markdown table of them all.

    python benchmarks/bench_partition.py --nodes 2400000 --avg-degree 50 --parts 2 4
    python benchmarks/bench_partition.py --nodes 100000 --avg-degree 20 --classes 16 --train split \
        --methods metis,kaminpar,random --kaminpar-threads 1 0

The graph is ``stages.download.synthetic.generate_synthetic`` (products-like: power-law degrees, communities) with
1 feature column (features do not change the topology and are not needed here). ``--train skewed`` replaces its
uniform train split by one concentrated in a tenth of the classes: the case where METIS alone leaves the train
nodes badly unbalanced.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import numpy as np

from stages.choices import PARTITION_METHODS
from stages.meter import measure
from stages.partition.assign import assign_parts
from stages.partition.kaminpar_runner import kaminpar_threads
from stages.partition.relabel import build_part_csr, relabel
from stages.partition.report import partition_report


def skewed_train_mask(y: np.ndarray, num_classes: int, fraction: float, seed: int) -> np.ndarray:
    """``fraction`` of the nodes as train nodes, as many as possible (up to 80 %) from the first tenth of classes."""
    rng = np.random.default_rng(seed)
    hot = y < max(1, num_classes // 10)
    num_train = int(round(fraction * y.shape[0]))
    num_hot = min(int(hot.sum()), int(0.8 * num_train))
    train_orig = np.concatenate([rng.choice(np.flatnonzero(hot), num_hot, replace=False),
                                 rng.choice(np.flatnonzero(~hot), num_train - num_hot, replace=False)])
    mask = np.zeros(y.shape[0], dtype=bool)
    mask[train_orig] = True
    return mask


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(PARTITION_METHODS))
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(PARTITION_METHODS)}")
    return methods


def _table(rows: list[dict[str, Any]]) -> str:
    """The RESULTS.md table: cut, imbalance per constraint, partitioner and total time, peak RSS (the whole
    configuration's, and the assignment's above what the process held before it)."""
    lines = ["| method | threads | parts | edge cut % | imbalance nodes / edges / train | partitioner s | "
             "assign s | total s | peak RSS GiB | assign peak - start GiB |", "|---" * 10 + "|"]
    for r in rows:
        imb = r["imbalance"]
        solver_s = r.get(f"{r['method']}_s", "-")
        lines.append(f"| {r['method']} | {r['threads'] or '-'} | {r['parts']} | {100 * r['edge_cut_fraction']:.1f} | "
                     f"{imb['nodes']:.3f} / {imb['edges']:.3f} / {imb['train_nodes']:.3f} | {solver_s} | "
                     f"{r['assign_s']} | {r['total_s']} | {r['peak_rss_GiB']} | "
                     f"{r['assign_peak_over_start_GiB']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2_400_000)
    ap.add_argument("--avg-degree", type=float, default=50.0, help="directed CSR entries per node")
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--methods", type=_methods, default=["metis"],
                    help=f"comma-separated, of {', '.join(PARTITION_METHODS)}")
    ap.add_argument("--kaminpar-threads", type=int, nargs="+", default=[1],
                    help="a KaMinPar row per thread count; 0: every usable CPU")
    ap.add_argument("--classes", type=int, default=47)
    ap.add_argument("--train", choices=["split", "skewed"], default="skewed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-balance-train", action="store_true")
    ap.add_argument("--no-balance-edges", action="store_true")
    args = ap.parse_args()

    from stages.download.synthetic import generate_synthetic

    t0 = time.perf_counter()
    graph = generate_synthetic(args.nodes, args.avg_degree, 1, args.classes, args.seed)
    graph.features.clear()   # topology only, as the partition stage reads it
    if args.train == "skewed":
        train_mask = skewed_train_mask(graph.y, args.classes, 0.08, args.seed)
    else:
        train_mask = np.zeros(graph.num_nodes, dtype=bool)
        train_mask[graph.splits["train"]] = True
    indptr, indices, y = graph.indptr, graph.indices, graph.y
    del graph
    gc.collect()
    generate_s = time.perf_counter() - t0
    graph_bytes = int(indptr.nbytes + indices.nbytes)

    runs = [(m, t) for m in args.methods for t in (args.kaminpar_threads if m == "kaminpar" else [None])]
    rows = []
    for (method, threads), num_parts in ((run, p) for run in runs for p in args.parts):
        stats: dict = {}
        gc.collect()
        with measure() as cost:
            t = time.perf_counter()
            # nested: it resets the kernel's high-water mark as the outer block starts, so both stay exact
            with measure() as assign_cost:
                part_of_orig = assign_parts(indptr, indices, train_mask, num_parts, method=method, seed=args.seed,
                                            balance_train=not args.no_balance_train,
                                            balance_edges=not args.no_balance_edges, stats=stats,
                                            threads=None if threads == 0 else threads)
            assign_s = time.perf_counter() - t
            t = time.perf_counter()
            report = partition_report(indptr, indices, part_of_orig, train_mask, num_parts)
            report_s = time.perf_counter() - t
            t = time.perf_counter()
            book = relabel(part_of_orig, num_parts)
            relabel_s = time.perf_counter() - t
            del part_of_orig
            t = time.perf_counter()
            for p in range(num_parts):
                csr = build_part_csr(indptr, indices, book, p)
                assert csr.indices.shape[0] == report["edges"][p]
                del csr
            csr_s = time.perf_counter() - t
            del book
        row = {
            "nodes": int(indptr.shape[0] - 1), "edges": int(indices.shape[0]), "parts": num_parts,
            "method": method, "threads": None if threads is None else kaminpar_threads(threads or None),
            "train": args.train, "generate_s": round(generate_s, 1),
            "assign_s": round(assign_s, 2), **stats, "report_s": round(report_s, 2), "relabel_s": round(relabel_s, 2),
            "build_csr_s": round(csr_s, 2), "total_s": cost["wall_s"],
            "graph_GiB": round(graph_bytes / 2**30, 3),
            "start_rss_GiB": round(cost["start_rss_bytes"] / 2**30, 3),
            # stages.meter resets the kernel's high-water mark (VmHWM) per configuration where Linux allows it
            "peak_rss_GiB": round(cost["peak_rss_bytes"] / 2**30, 3), "peak_rss_source": cost["peak_rss_source"],
            # the assignment alone (adjacency, METIS / KaMinPar, repair), over what the process held before it
            "assign_peak_over_start_GiB": round((assign_cost["peak_rss_bytes"] - cost["start_rss_bytes"]) / 2**30, 3),
            "edge_cut_fraction": report["edge_cut_fraction"], "imbalance": report["imbalance"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(_table(rows))
    del y


if __name__ == "__main__":
    main()
