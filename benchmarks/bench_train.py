"""Training throughput: 2-partition DDP (torchrun, gloo/nccl) vs one process holding the whole graph, and the feature
traffic of the hotness cache vs a degree cache (same budget) vs no cache.

The graph comes from the real stages (download → partition → features → hotness) into ``--root`` (cached there, so
a second run starts at once). Both sides use our sampler and the same model; ``--max-batches`` times that many
batches after ``--warmup`` and extrapolates to a full epoch (a products epoch on 2 cores is long). Prints one JSON
line. Products scale (do not run on a busy box)::

    python benchmarks/bench_train.py --nodes 2400000 --avg-degree 50 --features 100 --classes 47 --max-batches 20

One GPU (``make gpu-check`` runs this): one partition, one rank, each cache policy; ``uncached_MiB_per_epoch`` is
what crossed host -> device, and ``--feature-dtype`` picks the stored rows' dtype::

    python benchmarks/bench_train.py --parts 1 --device cuda --skip-single --feature-dtype float16

Small scale (a smoke test, ~1 min)::

    python benchmarks/bench_train.py --nodes 20000 --avg-degree 20 --features 32 --classes 8 --batch-size 128 \
        --max-batches 5 --hidden 64 --root /tmp/bench-train
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import get_args

from _graph_args import add_graph_args  # benchmarks/ is on sys.path when run as a script
from _train_bench import build_upstream, run_ranks

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stages.choices import CACHE_POLICIES, CudaGraph, Device, HostGather, Precision  # noqa: E402 - the repo is on sys.path
from storage.summaries import DownloadSummary, FeaturesSummary  # noqa: E402

RUNTIME = "runtime"   # the cache the train stage builds itself


def _time_batches(run, seed_batches, args) -> dict:
    """Run ``args.warmup`` untimed then ``args.max_batches`` timed training batches: ``run(items, num_real)``
    trains on them and returns the pass's ``EpochSums``."""
    batches = iter(seed_batches)
    run(itertools.islice(batches, args.warmup), args.warmup)
    sums = run(itertools.islice(batches, args.max_batches), args.max_batches)
    if sums.batches == 0:
        raise ValueError(f"an epoch has no batch left after {args.warmup} warm-up batches: lower --warmup or "
                         f"--batch-size")
    return {"batches": sums.batches, "wall_s": sums.wall_s, "sampled_edges": sums.sampled_edges,
            # this rank's split of the timed batches (stages.runtime.phases: CUDA events on a GPU), per batch
            "phases_ms_per_batch": {k: round(v * 1e3 / sums.batches, 3) for k, v in sums.phases_s.items()},
            # the prefetch thread's (sampling and gathering ahead; empty without prefetch)
            "prefetch_phases_ms_per_batch": {k: round(v * 1e3 / sums.batches, 3)
                                             for k, v in sums.prefetch_phases_s.items() if v}}


def _profile(trainer, seeds, device, args) -> dict:
    """``args.profile`` more batches of the same epoch under torch.profiler (rank 0 of one rank: a profile of a
    DDP rank would wait on its peers, which do not run these batches)."""
    from _profile import profile_batches

    def run() -> tuple[float, int]:
        sums = trainer.run_batches(itertools.islice(seeds, args.profile), args.profile, epoch=0)
        return sums.wall_s, sums.batches
    return profile_batches(run, cuda=device.type == "cuda")


def rank_main(args: argparse.Namespace) -> None:
    """One torchrun rank: load partition r exactly as the train worker does, then time each cache policy."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from stages.runtime.collectives import all_reduce
    from stages.runtime.dist_features import DistFeatures
    from stages.runtime.dist_sampler import equal_batch_count
    from stages.train.params import Params
    from stages.train.rank.cache_policy import cache_gids
    from stages.train.rank.prefetch import producer_group
    from stages.train.rank.rank_data import RankData
    from stages.train.rank.trainer import Trainer
    from stages.train.rank.worker import pick_device, rank_backend
    from stages.train.spec import TrainSpec
    from storage import ArtifactStore
    from storage.hotness import HotnessArtifact
    from storage.partition import PartitionArtifact

    spec = TrainSpec.load(args.spec)
    params = Params(**spec.params)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device = pick_device(params, local_rank, local_world)
    torch.set_num_threads(params.threads_per_rank or 1)
    torch.set_float32_matmul_precision(args.matmul_precision)
    dist.init_process_group(rank_backend(params, device), timeout=timedelta(seconds=600))
    data = RankData.open(spec, rank, world, local_world, device,
                         group=producer_group(params.prefetch_depth(device.type, world)))
    if not isinstance(data.features, DistFeatures):
        raise SystemExit("bench_train compares cache policies on a homogeneous graph's feature store")
    features = data.features
    trainer = Trainer(spec, params, data)
    loader = trainer.loader
    store = ArtifactStore(spec.artifacts)
    partition = PartitionArtifact(store, store.load("partition", spec.partition_key))
    hotness = HotnessArtifact(store, store.load("hotness", spec.hotness_key))
    batches_per_epoch = equal_batch_count(data.split_gid["train"].numel(), params.batch_size)
    results = {}
    for policy in args.policies.split(","):
        # "runtime": the cache RankData built, as the train stage does (on a GPU: sized by the device's free memory
        # and the caps); the others: that policy's plan (stages.train.rank.cache_policy), rebuilt here
        cache = features.cache if policy == RUNTIME else features.build_cache(
            torch.from_numpy(cache_gids(policy, partition=partition, hotness=hotness, rank=rank)))
        trainer.rng.seed_epoch(0)
        seeds = loader.train_batches()
        data.features.reset_counters()
        # the stage's own pass: its loss guard, prefetch and (one rank) no DDP wrapper
        timing = _time_batches(lambda items, n: trainer.run_batches(items, n, epoch=0), seeds, args)
        c = data.features.reset_counters()   # warm-up and timed batches: the rates below are per batch
        sums = torch.tensor([c.requested_rows, c.cache_hits, c.remote_rows, c.remote_bytes, timing["sampled_edges"],
                             c.local_bytes], dtype=torch.float64)
        sums = all_reduce(sums)
        wall = all_reduce(torch.tensor([timing["wall_s"]], dtype=torch.float64), dist.ReduceOp.MAX)
        counted = args.warmup + args.max_batches
        req, hits, remote, remote_bytes, edges, local_bytes = sums.tolist()
        s_per_batch = wall.item() / timing["batches"]
        results[policy] = {"cache_rows_per_rank": cache.num_rows, "cache_bytes_per_rank": cache.nbytes,
                           "s_per_batch": round(s_per_batch, 4), "epoch_s": round(s_per_batch * batches_per_epoch, 1),
                           "hit_rate": round(hits / max(req, 1), 4),
                           "remote_rows_per_epoch": round(remote / counted * batches_per_epoch),
                           "remote_MiB_per_epoch": round(remote_bytes / counted * batches_per_epoch / 2**20, 1),
                           # rows that did not come from the device cache: on a GPU, what crossed host -> device
                           "uncached_MiB_per_epoch": round((local_bytes + remote_bytes) / counted * batches_per_epoch
                                                           / 2**20, 1),
                           "sampled_edges_per_s": round(edges / wall.item()),   # timed batches, all ranks
                           "phases_ms_per_batch": timing["phases_ms_per_batch"],   # rank 0's
                           "prefetch_phases_ms_per_batch": timing["prefetch_phases_ms_per_batch"]}
        if policy == args.policies.split(",")[0] and args.profile:   # one rank (main checks)
            results[policy]["profile"] = _profile(trainer, seeds, device, args)
    if rank == 0:
        out = {"world_size": world, "batches_per_epoch": batches_per_epoch, "device": str(device),
               "prefetch": trainer.prefetch, "precision": params.precision, "matmul_precision": args.matmul_precision,
               "cuda_graph": "on" if trainer.not_graphed is None else f"off: {trainer.not_graphed}",
               "graphed_sampling": trainer.sampling_report() if hasattr(trainer, "sampling_report") else None,
               "cache_budget": data.setup.get("cache_budget"), "graph": data.setup.get("graph"),
               "graph_placement": data.setup.get("graph_placement"), "policies": results}
        Path(spec.result_dir, "bench.json").write_text(json.dumps(out))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)   # as the train worker: skip the process-group teardown


def single_main(args: argparse.Namespace, manifests: dict) -> dict:
    """The baseline: the whole graph and all of x in this one process, our sampler, the same model, no DDP."""
    import numpy as np
    import torch

    from stages.runtime.sampler import LocalCSR, NeighborSampler, iter_seed_batches
    from stages.train.models.model import build_model
    from stages.train.rank.loop import train_epoch
    from stages.train.tasks import NodeClassification
    from storage import ArtifactStore
    from storage.features import FeaturesArtifact
    from storage.partition import PartitionArtifact, concat_parts

    torch.set_num_threads(args.threads)
    store = ArtifactStore(args.root)
    partition = PartitionArtifact(store, manifests["partition"])
    features = FeaturesArtifact(store, manifests["features"])
    parts = partition.num_partitions
    csr = LocalCSR.from_numpy(*concat_parts([partition.csr(p) for p in range(parts)]), start_gid=0)
    feats = [features.part(p) for p in range(parts)]
    x = torch.from_numpy(np.concatenate([f.x for f in feats]))          # gid order: parts are contiguous ranges
    y = torch.from_numpy(np.concatenate([f.y for f in feats]))
    train_gid = torch.from_numpy(np.concatenate([f.split_lids["train"] + f.start_gid for f in feats]))
    del feats
    gen = torch.Generator().manual_seed(0)
    sampler = NeighborSampler(csr, args.fanouts, generator=gen)
    torch.manual_seed(0)
    model = build_model("sage", in_channels=x.shape[1], hidden=args.hidden, out_channels=int(y.max()) + 1,
                        num_layers=len(args.fanouts), dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    seeds = iter_seed_batches(train_gid, args.batch_size, generator=gen)
    task = NodeClassification(lambda s: y.index_select(0, s))

    def run(items, num_real: int):
        return train_epoch(model, optimizer, items, sampler.sample, lambda n_id: x.index_select(0, n_id), task,
                           num_real_batches=num_real, device=torch.device("cpu"))
    timing = _time_batches(run, seeds, args)
    batches_per_epoch = math.ceil(train_gid.numel() / args.batch_size)
    s_per_batch = timing["wall_s"] / timing["batches"]
    return {"threads": args.threads, "batches_per_epoch": batches_per_epoch, "s_per_batch": round(s_per_batch, 4),
            "epoch_s": round(s_per_batch * batches_per_epoch, 1),
            "sampled_edges_per_s": round(timing["sampled_edges"] / timing["wall_s"])}


def dist_run(args: argparse.Namespace, manifests: dict) -> dict:
    from stages.train.params import Params

    # prefetch: the train stage's default unless --prefetch (bench_prefetch times the depths against each other)
    params = Params(hidden=args.hidden, fanouts=tuple(args.fanouts), device=args.device, host_gather=args.host_gather,
                    batch_size=args.batch_size, epochs=1, threads_per_rank=args.threads_per_rank,
                    prefetch=args.prefetch, ranks_per_gpu=args.ranks_per_gpu, precision=args.precision,
                    device_cache_ratio=args.device_cache_ratio, cuda_graph=args.cuda_graph)
    return run_ranks(__file__, args, manifests, params, args.parts,
                     # what the rank worker reads from its own argv (the rest travels in the params)
                     ["--max-batches", str(args.max_batches), "--warmup", str(args.warmup),
                      "--profile", str(args.profile), "--policies", args.policies,
                      "--matmul-precision", args.matmul_precision])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_args(ap)
    ap.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[15, 10, 5])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--cache-ratio", type=float, default=0.2, help="hotness plan budget (of a partition's rows)")
    ap.add_argument("--parts", type=int, default=2, help="partitions = ranks (1: one GPU, no remote rows)")
    ap.add_argument("--feature-dtype", default="auto", help="the features stage's dtype (the stored rows)")
    ap.add_argument("--device", choices=get_args(Device), default="auto", help="the ranks' device")
    ap.add_argument("--host-gather", choices=get_args(HostGather), default="auto", help="CUDA: own host rows' path")
    ap.add_argument("--ranks-per-gpu", type=int, default=1,
                    help="CUDA: ranks sharing each GPU over gloo (e.g. --parts 2 --ranks-per-gpu 2 on one card)")
    ap.add_argument("--policies", default=",".join((RUNTIME, *CACHE_POLICIES)),
                    help=f"caches to time, in order: {RUNTIME} (the train stage's own) and plans of "
                         f"{', '.join(CACHE_POLICIES)}")
    ap.add_argument("--device-cache-ratio", type=float, default=None, help=f"cap on the {RUNTIME} cache (rows)")
    ap.add_argument("--prefetch", type=int, default=None, help="batches prepared ahead (default: the stage's auto)")
    ap.add_argument("--precision", choices=get_args(Precision), default="float32", help="the model's products")
    ap.add_argument("--cuda-graph", choices=get_args(CudaGraph), default="off",
                    help="auto: each training step replayed as one captured CUDA graph (stages.train.rank.graphed)")
    ap.add_argument("--matmul-precision", choices=("highest", "high", "medium"), default="highest",
                    help="torch.set_float32_matmul_precision in the ranks (high: TF32 GEMMs)")
    ap.add_argument("--max-batches", type=int, default=20, help="timed batches; the epoch time is extrapolated")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0,
                    help="one rank: profile this many more batches of the first policy (torch.profiler summary)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="single-process baseline")
    ap.add_argument("--threads-per-rank", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--timeout-s", type=float, default=6 * 3600)
    ap.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "artifacts"))
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--prepare-only", action="store_true",
                    help="only build the stages up to hotness into --root (make gpu-check does it while the CUDA "
                         "tests run)")
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        rank_main(args)
        return
    policies = args.policies.split(",")
    if unknown := [p for p in policies if p not in (RUNTIME, *CACHE_POLICIES)]:
        ap.error(f"unknown policy {unknown[0]!r}: choose from {RUNTIME}, {', '.join(CACHE_POLICIES)}")
    if RUNTIME in policies[1:]:
        ap.error(f"{RUNTIME} must come first: the other policies replace the cache the ranks built")
    if not args.skip_single and "hotness" not in policies:
        ap.error("the single-process baseline is compared with the hotness policy: add it or pass --skip-single")
    if args.profile and args.parts != 1:
        ap.error("--profile needs --parts 1: a profiled DDP rank would wait on peers that run no such batches")
    start = time.perf_counter()
    manifests = build_upstream(args, args.parts, feature_dtype=args.feature_dtype, cache_ratio=args.cache_ratio)
    graph = DownloadSummary.from_json(manifests["download"].summary)
    features = FeaturesSummary.from_json(manifests["features"].summary)
    result = {"nodes": graph.num_nodes, "edges": graph.num_edges, "fanouts": args.fanouts,
              "batch_size": args.batch_size, "hidden": args.hidden, "layers": len(args.fanouts),
              "max_batches": args.max_batches, "pipeline_s": round(time.perf_counter() - start, 1),
              "parts": args.parts, "feature_dtype": features.feature_dtype,
              "host_gather": args.host_gather}
    if args.prepare_only:
        print(json.dumps(result), flush=True)
        return
    result["dist"] = dist_run(args, manifests)
    if not args.skip_single:
        result["single"] = single_main(args, manifests)
        result["dist_speedup_hotness"] = round(result["single"]["epoch_s"] / result["dist"]["policies"]["hotness"]
                                               ["epoch_s"], 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
