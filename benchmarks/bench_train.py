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

The step's settings ``--cuda-graph`` and ``--precision`` each take a comma list, and every combination is timed on
one load of the rank data (``variants`` in the JSON, by name, e.g. ``auto/tf32``):
the first under every policy, the others on the first policy's cache::

    python benchmarks/bench_train.py --parts 1 --device cuda --skip-single --policies runtime \
        --cuda-graph off,step,auto --precision float32,tf32 --profile 10

Ranks that fail or are stopped (``make gpu-check``'s SIGINT at a step's limit) after the first policy's timing, in a
profile say, still print its figures, with ``dist.failed`` saying what happened, and exit 1.

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
from typing import Any, get_args

from _graph_args import add_graph_args  # benchmarks/ is on sys.path when run as a script
from _train_bench import RUNTIME, build_upstream, dist_result, run_rank_worker, run_ranks, upstream_values

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stages.choices import CACHE_POLICIES, CudaGraph, Device, HostGather, Precision  # noqa: E402 - the repo is on sys.path
from stages.train.params import Params as TrainParams  # noqa: E402
from storage.summaries import DownloadSummary, FeaturesSummary  # noqa: E402

VARIED = ("cuda_graph", "precision")   # the step's settings a run may list several of


def choice_list(choices: tuple[str, ...]):
    """An argparse type: a comma list of ``choices``."""
    def parse(text: str) -> list[str]:
        values = text.split(",")
        if bad := [v for v in values if v not in choices]:
            raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {', '.join(choices)}")
        return values
    return parse


def variants(args: argparse.Namespace) -> list[dict[str, str]]:
    """Every combination of the listed step settings, in the order given: the first is the one every policy runs
    under; the others time the first policy's cache only (``rank_main``)."""
    return [dict(zip(VARIED, combination)) for combination in itertools.product(*(getattr(args, n) for n in VARIED))]


def variant_name(variant: dict[str, str]) -> str:
    return "/".join(variant.values())   # e.g. auto/tf32


def rank_main(args: argparse.Namespace) -> None:
    """One torchrun rank: load partition r exactly as the train worker does, then time each cache policy, and the
    first policy's cache under each further variant of the step's settings (one load serves them all: ~30 s of a
    products-scale run on an H200, where 30 batches take ~0.5 s)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from stages.runtime.dist_features import DistFeatures
    from stages.runtime.sampling.dist_sampler import equal_batch_count
    from stages.train.params import Params
    from stages.train.rank.prefetch import producer_group
    from stages.train.rank.rank_data import RankData
    from stages.train.rank.worker import pick_device, rank_backend
    from stages.train.spec import TrainSpec

    spec = TrainSpec.load(args.spec)
    params = Params(**spec.params)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device = pick_device(params, local_rank, local_world)
    torch.set_num_threads(params.threads_per_rank or 1)
    dist.init_process_group(rank_backend(params, device, local_world), timeout=timedelta(seconds=600))
    data = RankData.open(spec, rank, world, local_world, device,
                         group=producer_group(params.prefetch_depth(device.type, world)))
    if not isinstance(data.features, DistFeatures):
        raise SystemExit("bench_train compares cache policies on a homogeneous graph's feature store")
    from _train_timing import RankTimer, time_runs

    runs = [(policy, v) for i, policy in enumerate(args.policies.split(","))
            for v in (variants(args) if i == 0 else variants(args)[:1])]
    # every rank: equal_batch_count is a collective
    batches_per_epoch = equal_batch_count(data.split_gid["train"].numel(), params.batch_size)
    timer = RankTimer(spec, params, data, args, batches_per_epoch)

    def write(ran: list[tuple[str, dict[str, str]]], timed: list[dict]) -> None:
        """``bench.json`` of the runs timed so far (rank 0): once the first policy's are, again at the end."""
        if rank != 0:
            return
        figures = [{"variant": variant_name(v), **f} for (_, v), f in zip(ran, timed)]
        first = figures[0]
        out = {"world_size": world, "device": str(device), "batches_per_epoch": batches_per_epoch,
               **{k: first[k] for k in ("prefetch", "precision", "matmul_precision", "cuda_graph",
                                        "graphed_sampling")},
               "cache_budget": data.setup.get("cache_budget"), "graph": data.setup.get("graph"),
               "graph_placement": data.setup.get("graph_placement"),
               # every policy under the first variant; then the first policy under each other variant, by name
               "policies": {policy: f for (policy, v), f in zip(ran, figures) if v == ran[0][1]},
               "variants": {f["variant"]: f for (policy, v), f in zip(ran[1:], figures[1:])
                            if policy == ran[0][0]}}
        Path(spec.result_dir, "bench.json").write_text(json.dumps(out))
    write(runs, time_runs(runs, timer, rounds=args.rounds, profile=args.profile > 0, on_timed=write))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)   # as the train worker: skip the process-group teardown


def single_main(args: argparse.Namespace, manifests: dict) -> dict:
    """The baseline: the whole graph and all of x in this one process, our sampler, the same model, no DDP."""
    import numpy as np
    import torch
    from _train_timing import time_batches

    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
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
    timing = time_batches(run, seeds, warmup=args.warmup, max_batches=args.max_batches)
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
                    prefetch=args.prefetch, ranks_per_gpu=args.ranks_per_gpu, precision=args.precision[0],
                    device_cache_ratio=args.device_cache_ratio, cuda_graph=args.cuda_graph[0])
    return run_ranks(__file__, args, manifests, params, args.parts,
                     # what the rank worker reads from its own argv (the rest travels in the params)
                     ["--max-batches", str(args.max_batches), "--warmup", str(args.warmup),
                      "--profile", str(args.profile), "--policies", args.policies, "--rounds", str(args.rounds),
                      *(arg for name in VARIED for arg in (f"--{name.replace('_', '-')}",
                                                           ",".join(getattr(args, name))))])


def stage_values(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline values of the stages the ranks read: one partition a rank, the hotness plan of --cache-ratio."""
    return upstream_values(args, args.parts, feature_dtype=args.feature_dtype, cache_ratio=args.cache_ratio)


def parser() -> argparse.ArgumentParser:
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
    # the step's settings: each a comma list; every combination is timed, on one load of the rank data (variants)
    # their defaults: the train stage's
    ap.add_argument("--precision", type=choice_list(get_args(Precision)),
                    default=[TrainParams.model_fields["precision"].default],
                    help="the model's products (tf32: float32 with TensorFloat32 GEMMs on a GPU)")
    ap.add_argument("--cuda-graph", type=choice_list(get_args(CudaGraph)),
                    default=[TrainParams.model_fields["cuda_graph"].default],
                    help="step: each training step replayed as one captured CUDA graph (stages.train.rank.graphed); "
                         "auto: its sampling too (graphed_sampling); e.g. off,step,auto")
    ap.add_argument("--max-batches", type=int, default=20, help="timed batches; the epoch time is extrapolated")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the first policy's variants this many times, in alternating order (drift)")
    ap.add_argument("--profile", type=int, default=0,
                    help="one rank: profile this many more batches of the first policy under each variant "
                         "(torch.profiler summary)")
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
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.rank_worker:
        run_rank_worker(args.spec, lambda: rank_main(args))
    policies = args.policies.split(",")
    if unknown := [p for p in policies if p not in (RUNTIME, *CACHE_POLICIES)]:
        ap.error(f"unknown policy {unknown[0]!r}: choose from {RUNTIME}, {', '.join(CACHE_POLICIES)}")
    if RUNTIME in policies[1:]:
        ap.error(f"{RUNTIME} must come first: the other policies replace the cache the ranks built")
    for name, values in (("policies", policies), *((n, getattr(args, n)) for n in VARIED)):
        if len(set(values)) < len(values):
            ap.error(f"--{name.replace('_', '-')} lists a value twice: {','.join(values)}")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if not args.skip_single and "hotness" not in policies:
        ap.error("the single-process baseline is compared with the hotness policy: add it or pass --skip-single")
    if args.profile and args.parts != 1:
        ap.error("--profile needs --parts 1: a profiled DDP rank would wait on peers that run no such batches")
    start = time.perf_counter()
    manifests = build_upstream(stage_values(args))
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
    # ranks that fail or are stopped after the first policy's timing (e.g. in a profile): its figures, exit 1
    dist_result(result, lambda: dist_run(args, manifests))
    if not args.skip_single:
        result["single"] = single_main(args, manifests)
        result["dist_speedup_hotness"] = round(result["single"]["epoch_s"] / result["dist"]["policies"]["hotness"]
                                               ["epoch_s"], 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
