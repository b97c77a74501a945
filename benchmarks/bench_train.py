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

The step's settings ``--cuda-graph``, ``--precision`` and ``--matmul-precision`` each take a comma list, and every
combination is timed on one load of the rank data (``variants`` in the JSON, by name, e.g. ``auto/float32/high``):
the first under every policy, the others on the first policy's cache::

    python benchmarks/bench_train.py --parts 1 --device cuda --skip-single --policies runtime \
        --cuda-graph off,step,auto --matmul-precision highest,high --profile 10

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
VARIED = ("cuda_graph", "precision", "matmul_precision")   # the step's settings a run may list several of


def choice_list(choices: tuple[str, ...]):
    """An argparse type: a comma list of ``choices``."""
    def parse(text: str) -> list[str]:
        values = text.split(",")
        if bad := [v for v in values if v not in choices]:
            raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {', '.join(choices)}")
        return values
    return parse


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
            # the split of the timed batches (stages.runtime.phases), and the prefetch thread's
            "phases_s": dict(sums.phases_s), "prefetch_phases_s": dict(sums.prefetch_phases_s)}


def _profile(trainer, seeds, device, args) -> dict:
    """``args.profile`` more batches of the same epoch under torch.profiler (rank 0 of one rank: a profile of a
    DDP rank would wait on its peers, which do not run these batches)."""
    from _profile import profile_batches

    def run() -> tuple[float, int]:
        sums = trainer.run_batches(itertools.islice(seeds, args.profile), args.profile, epoch=0)
        return sums.wall_s, sums.batches
    return profile_batches(run, cuda=device.type == "cuda")


def variants(args: argparse.Namespace) -> list[dict[str, str]]:
    """Every combination of the listed step settings, in the order given: the first is the one every policy runs
    under; the others time the first policy's cache only (``rank_main``)."""
    return [dict(zip(VARIED, combination)) for combination in itertools.product(*(getattr(args, n) for n in VARIED))]


def variant_name(variant: dict[str, str]) -> str:
    return "/".join(variant.values())   # e.g. auto/float32/high


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
    dist.init_process_group(rank_backend(params, device), timeout=timedelta(seconds=600))
    data = RankData.open(spec, rank, world, local_world, device,
                         group=producer_group(params.prefetch_depth(device.type, world)))
    if not isinstance(data.features, DistFeatures):
        raise SystemExit("bench_train compares cache policies on a homogeneous graph's feature store")
    runs = [(policy, v) for i, policy in enumerate(args.policies.split(","))
            for v in (variants(args) if i == 0 else variants(args)[:1])]
    timed = _time_runs(runs, spec, params, data, args)
    if rank == 0:
        first = timed[0][1]
        out = {"world_size": world, "device": str(device),
               "batches_per_epoch": equal_batch_count(data.split_gid["train"].numel(), params.batch_size),
               **{k: first[k] for k in ("prefetch", "precision", "matmul_precision", "cuda_graph",
                                        "graphed_sampling")},
               "cache_budget": data.setup.get("cache_budget"), "graph": data.setup.get("graph"),
               "graph_placement": data.setup.get("graph_placement"),
               # every policy under the first variant; then the first policy under each other variant, by name
               "policies": {policy: figures for (policy, v), figures in timed if v == runs[0][1]},
               "variants": {variant_name(v): figures for (policy, v), figures in timed[1:] if policy == runs[0][0]}}
        Path(spec.result_dir, "bench.json").write_text(json.dumps(out))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)   # as the train worker: skip the process-group teardown


def _time_runs(runs, spec, params, data, args) -> list[tuple[tuple[str, dict], dict]]:
    """Time each (policy, variant) of ``runs`` on the loaded rank data: a trainer per run (released before the
    next: a captured graph holds its own memory pool), the policy's cache built where it changes. The first
    policy's variants run ``args.rounds`` times in alternating order (forward, backward, ...), so that the
    machine's drift weighs on each alike (on a CPU, 6 eager runs of one setting drifted 10 % in order); their
    figures are over all their rounds' batches, with each round's ms a batch beside them."""
    import gc

    import torch

    from stages.train.rank.cache_policy import cache_gids
    from stages.train.rank.trainer import Trainer
    from storage import ArtifactStore
    from storage.hotness import HotnessArtifact
    from storage.partition import PartitionArtifact

    store = ArtifactStore(spec.artifacts)
    partition = PartitionArtifact(store, store.load("partition", spec.partition_key))
    hotness = HotnessArtifact(store, store.load("hotness", spec.hotness_key))
    first = [i for i, (policy, _) in enumerate(runs) if policy == runs[0][0]]
    order = [i for k in range(args.rounds) for i in (first if k % 2 == 0 else first[::-1])] + \
        list(range(len(first), len(runs)))
    features, cached = data.features, RUNTIME
    measured: dict[int, dict] = {}
    profiles: dict[int, dict] = {}
    settings: dict[int, dict] = {}
    for i in order:
        policy, variant = runs[i]
        if policy != cached:   # "runtime": the cache RankData built (on a GPU: sized by the free memory and the
            # caps), as the train stage does; the others: that policy's plan (stages.train.rank.cache_policy)
            features.build_cache(torch.from_numpy(cache_gids(policy, partition=partition, hotness=hotness,
                                                             rank=data.rank)))
            cached = policy
        torch.set_float32_matmul_precision(variant["matmul_precision"])
        trainer = Trainer(spec, params.model_copy(update={k: variant[k] for k in ("cuda_graph", "precision")}),
                          data)
        trainer.rng.seed_epoch(0)
        seeds = trainer.loader.train_batches()
        raw = _measure(trainer, seeds, data, args)
        measured[i] = _add(measured[i], raw) if i in measured else raw
        if args.profile and i in first and i not in profiles:   # one rank (main checks)
            profiles[i] = _profile(trainer, seeds, data.device, args)
        settings[i] = _settings(trainer)
        del trainer
        gc.collect()
        if data.device.type == "cuda":
            torch.cuda.empty_cache()
    return [(run, {"variant": variant_name(run[1]), **_figures(measured[i], data, args), **settings[i],
                   **({"profile": profiles[i]} if i in profiles else {})}) for i, run in enumerate(runs)]


def _settings(trainer) -> dict:
    """The trainer's settings as it ran them."""
    import torch

    return {"prefetch": trainer.prefetch, "precision": trainer.params.precision,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_graph": "on" if trainer.not_graphed is None else f"off: {trainer.not_graphed}",
            "graphed_sampling": trainer.sampling_report()}


def _measure(trainer, seeds, data, args) -> dict:
    """The stage's own pass (its loss guard, prefetch and, one rank, no DDP wrapper) over the first batches of
    ``seeds``: every rank's sums (the slowest rank's wall time) and rank 0's split of the time."""
    import torch
    import torch.distributed as dist

    from stages.runtime.collectives import all_reduce

    data.features.reset_counters()
    timing = _time_batches(lambda items, n: trainer.run_batches(items, n, epoch=0), seeds, args)
    c = data.features.reset_counters()   # warm-up and timed batches
    sums = all_reduce(torch.tensor([c.requested_rows, c.cache_hits, c.remote_rows, c.remote_bytes, c.local_bytes,
                                    timing["sampled_edges"]], dtype=torch.float64)).tolist()
    wall = all_reduce(torch.tensor([timing["wall_s"]], dtype=torch.float64), dist.ReduceOp.MAX).item()
    return {**dict(zip(("requested_rows", "cache_hits", "remote_rows", "remote_bytes", "local_bytes",
                        "sampled_edges"), sums)),
            "wall_s": wall, "batches": timing["batches"], "counted": args.warmup + args.max_batches,
            "phases_s": timing["phases_s"], "prefetch_phases_s": timing["prefetch_phases_s"],
            "round_ms": [round(wall * 1e3 / timing["batches"], 2)]}


def _add(a: dict, b: dict) -> dict:
    """Two measurements summed field by field: numbers add, lists join, dicts (the phases) add key by key."""
    out = dict(a)
    for key, value in b.items():
        out[key] = value if key not in out else _add(out[key], value) if isinstance(value, dict) else \
            out[key] + value
    return out


def _figures(raw: dict, data, args) -> dict:
    """Per-batch rates of a measurement (``_measure``, summed over rounds) and its feature traffic per epoch."""
    from stages.runtime.sampling.dist_sampler import equal_batch_count

    batches_per_epoch = equal_batch_count(data.split_gid["train"].numel(), args.batch_size)
    s_per_batch, counted = raw["wall_s"] / raw["batches"], raw["counted"]   # counted: warm-up batches too
    cache = data.features.cache
    return {"cache_rows_per_rank": cache.num_rows, "cache_bytes_per_rank": cache.nbytes,
            "s_per_batch": round(s_per_batch, 4), "epoch_s": round(s_per_batch * batches_per_epoch, 1),
            "rounds_ms_per_batch": raw["round_ms"],
            "hit_rate": round(raw["cache_hits"] / max(raw["requested_rows"], 1), 4),
            "remote_rows_per_epoch": round(raw["remote_rows"] / counted * batches_per_epoch),
            "remote_MiB_per_epoch": round(raw["remote_bytes"] / counted * batches_per_epoch / 2**20, 1),
            # rows that did not come from the device cache: on a GPU, what crossed host -> device
            "uncached_MiB_per_epoch": round((raw["local_bytes"] + raw["remote_bytes"]) / counted
                                            * batches_per_epoch / 2**20, 1),
            "sampled_edges_per_s": round(raw["sampled_edges"] / raw["wall_s"]),   # timed batches, all ranks
            # rank 0's split of the timed batches (stages.runtime.phases: CUDA events on a GPU), per batch
            "phases_ms_per_batch": {k: round(v * 1e3 / raw["batches"], 3) for k, v in raw["phases_s"].items()},
            # the prefetch thread's (sampling and gathering ahead; empty without prefetch)
            "prefetch_phases_ms_per_batch": {k: round(v * 1e3 / raw["batches"], 3)
                                             for k, v in raw["prefetch_phases_s"].items() if v}}


def single_main(args: argparse.Namespace, manifests: dict) -> dict:
    """The baseline: the whole graph and all of x in this one process, our sampler, the same model, no DDP."""
    import numpy as np
    import torch

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
                    prefetch=args.prefetch, ranks_per_gpu=args.ranks_per_gpu, precision=args.precision[0],
                    device_cache_ratio=args.device_cache_ratio, cuda_graph=args.cuda_graph[0])
    return run_ranks(__file__, args, manifests, params, args.parts,
                     # what the rank worker reads from its own argv (the rest travels in the params)
                     ["--max-batches", str(args.max_batches), "--warmup", str(args.warmup),
                      "--profile", str(args.profile), "--policies", args.policies, "--rounds", str(args.rounds),
                      *(arg for name in VARIED for arg in (f"--{name.replace('_', '-')}",
                                                           ",".join(getattr(args, name))))])


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
    # the step's settings: each a comma list; every combination is timed, on one load of the rank data (variants)
    ap.add_argument("--precision", type=choice_list(get_args(Precision)), default=["float32"],
                    help="the model's products")
    ap.add_argument("--cuda-graph", type=choice_list(get_args(CudaGraph)), default=["off"],
                    help="step: each training step replayed as one captured CUDA graph (stages.train.rank.graphed); "
                         "auto: its sampling too (graphed_sampling); e.g. off,step,auto")
    ap.add_argument("--matmul-precision", type=choice_list(("highest", "high", "medium")), default=["highest"],
                    help="torch.set_float32_matmul_precision in the ranks (high: TF32 GEMMs)")
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
