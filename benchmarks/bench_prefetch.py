"""Prefetch (``train.prefetch``) against the synchronous loop, side by side in one run: DDP ranks (torchrun, gloo on
the CPU) time training batches at each depth, in alternating rounds (so that load drifting on a shared machine
hits every depth alike), and the two halves of a synchronous batch: preparing it (seeds, sampling, rows: the
producer's work) and the rest (the model, the backward, the step). Prefetch can at best bring a batch from their
sum down to the larger of the two, and only where a core is free to run the producer beside the model.

The graph comes from the real stages into ``--root`` (cached there). Prints one JSON line. A model small enough
that sampling matters (hidden 16), 2 ranks on the default-size synthetic graph of this file::

    python benchmarks/bench_prefetch.py --ranks 2 --hidden 16 --root /tmp/bench-prefetch

With ``--off-cpu-ms`` each training batch also sleeps that long in the main thread before its model: a stand-in
for model time spent on a GPU, which leaves a core to the producer; the synchronous path pays it on top.

Both depths run on the same rank data, whose batch collectives are on the producer's process group (the
synchronous loop calls them from the main thread; the cost is the same group's either way).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# benchmarks/ is on sys.path when run as a script
from _train_bench import build_upstream, dist_result, run_rank_worker, run_ranks, upstream_values

from storage.summaries import DownloadSummary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rank_main(args: argparse.Namespace) -> None:
    """One torchrun rank: the train worker's data and trainer, then the timed rounds."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from stages.runtime.collectives import all_reduce_f64
    from stages.train.params import Params
    from stages.train.rank.loop import preparer, train_epoch
    from stages.train.rank.prefetch import batch_stream, producer_group
    from stages.train.rank.rank_data import RankData
    from stages.train.rank.trainer import Trainer
    from stages.train.rank.worker import pick_device, rank_backend
    from stages.train.spec import TrainSpec

    spec = TrainSpec.load(args.spec)
    params = Params(**spec.params)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(params.threads_per_rank or 1)
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    device = pick_device(params, int(os.environ["LOCAL_RANK"]), local_world)
    dist.init_process_group(rank_backend(params, device, local_world), timeout=timedelta(seconds=600))
    depths = [int(d) for d in args.depths.split(",")]
    data = RankData.open(spec, rank, world, world, device, group=producer_group(max(depths)))
    trainer = Trainer(spec, params.model_copy(update={"prefetch": max(depths)}), data)
    loader = trainer.loader
    count = args.warmup + args.max_batches

    def max_wall(seconds: float) -> float:   # a round lasts as long as its slowest rank
        return all_reduce_f64([seconds], dist.ReduceOp.MAX)[0]

    def train_round(depth: int) -> float:
        trainer.rng.seed_epoch(0)   # every round trains on the same batches
        items = itertools.islice(loader.train_batches(), count)
        sums = train_epoch(trainer.train_module, trainer.optimizer, items, loader.sample, loader.gather_rows,
                           trainer.task, num_real_batches=count, device=device, prefetch=depth, on_batch=off_cpu)
        return max_wall(sums.wall_s) / sums.batches

    def off_cpu(b: int) -> None:   # model time spent off the CPU, as on a GPU (--off-cpu-ms)
        time.sleep(args.off_cpu_ms / 1000)

    def prepare_round() -> float:   # the producer's share of a batch, run synchronously
        trainer.rng.seed_epoch(0)
        prepare = preparer(loader.sample, loader.gather_rows, trainer.task, training=True)
        start = time.perf_counter()
        with batch_stream(itertools.islice(loader.train_batches(), count), prepare, depth=0, device=device) as stream:
            n = sum(1 for _ in stream)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return max_wall(time.perf_counter() - start) / n

    for depth in depths:   # warm-up: allocator, thread pools, page cache
        train_round(depth)
    timed: dict[str, list[float]] = {str(d): [] for d in depths}
    timed["prepare"] = []
    for _ in range(args.rounds):
        for depth in depths:
            timed[str(depth)].append(train_round(depth))
        timed["prepare"].append(prepare_round())
    if rank == 0:
        median = {k: statistics.median(v) for k, v in timed.items()}
        out = {"world_size": world, "device": str(device), "threads_per_rank": params.threads_per_rank,
               "off_cpu_ms": args.off_cpu_ms,
               "s_per_batch_median": {k: round(v, 5) for k, v in median.items()},
               "s_per_batch_rounds": {k: [round(x, 5) for x in v] for k, v in timed.items()},
               "model_s_per_batch": round(median["0"] - median["prepare"], 5),
               "speedup": {d: round(median["0"] / median[d], 3) for d in map(str, depths) if d != "0"}}
        Path(spec.result_dir, "bench.json").write_text(json.dumps(out))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)   # as the train worker: skip the process-group teardown


def dist_run(args: argparse.Namespace, manifests: dict) -> dict:
    from stages.train.params import Params

    # the eager step in float32, as these depths were always timed: its train_epoch runs no graphed step
    params = Params(hidden=args.hidden, fanouts=tuple(args.fanouts), batch_size=args.batch_size, epochs=1,
                    threads_per_rank=args.threads_per_rank, device=args.device, cuda_graph="off",
                    precision="float32")
    return run_ranks(__file__, args, manifests, params, args.ranks,
                     ["--max-batches", str(args.max_batches), "--warmup", str(args.warmup), "--rounds",
                      str(args.rounds), "--depths", args.depths, "--off-cpu-ms", str(args.off_cpu_ms)])


def stage_values(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline values of the stages the ranks read: one partition a rank."""
    return upstream_values(args, args.ranks, feature_dtype=args.feature_dtype)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # the default: a graph whose epoch of small-model batches takes seconds on this 2-core box
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--avg-degree", type=float, default=20.0)
    ap.add_argument("--features", type=int, default=100)
    ap.add_argument("--classes", type=int, default=47)
    ap.add_argument("--ranks", type=int, default=2, help="partitions, one rank each")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="the ranks' device (auto: a "
                                                                                    "GPU each when there are enough)")
    ap.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[15, 10, 5])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--feature-dtype", default="auto", help="the features stage's dtype (the stored rows)")
    ap.add_argument("--depths", default="0,1,2", help="prefetch depths to compare (0: synchronous)")
    ap.add_argument("--max-batches", type=int, default=10, help="timed batches per round")
    ap.add_argument("--warmup", type=int, default=0, help="untimed batches before each round's timed ones")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--off-cpu-ms", type=float, default=0.0,
                    help="a sleep before each batch's model: model time spent off the CPU, as a GPU's would be, "
                         "which leaves the producer a core on a machine whose cores the ranks fill")
    ap.add_argument("--threads-per-rank", type=int, help="default: this machine's CPUs / --ranks")
    ap.add_argument("--timeout-s", type=float, default=3600)
    ap.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "artifacts"))
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    args.threads_per_rank = args.threads_per_rank or max(1, (os.cpu_count() or 2) // args.ranks)
    if args.rank_worker:
        run_rank_worker(args.spec, lambda: rank_main(args))
    manifests = build_upstream(stage_values(args))
    graph = DownloadSummary.from_json(manifests["download"].summary)
    result = {"nodes": graph.num_nodes, "edges": graph.num_edges, "fanouts": args.fanouts,
              "batch_size": args.batch_size, "hidden": args.hidden, "max_batches": args.max_batches,
              "rounds": args.rounds, "cpus": os.cpu_count(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    dist_result(result, lambda: dist_run(args, manifests))
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
