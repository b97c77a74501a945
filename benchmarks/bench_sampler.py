"""Throughput of the neighbour sampler (single partition or 2 gloo ranks) on a power-law graph.

Prints one JSON line. Examples::

    .venv/bin/python benchmarks/bench_sampler.py --nodes 2400000 --avg-degree 50 --graph benchmarks/work/products.npz
    .venv/bin/python benchmarks/bench_sampler.py --graph benchmarks/work/products.npz --mode dist
    .venv/bin/python benchmarks/bench_sampler.py --graph g.npz --mode dist --edge-features 8   # + e_id, edge_attr

The graph comes from ``stages.download.synthetic.generate_synthetic`` when that module exists, else from the numpy
Chung-Lu stand-in below; ``--graph PATH.npz`` caches it (``indptr``, ``indices``: CSR of incoming edges, gids).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def power_law_graph(num_nodes: int, avg_degree: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Undirected Chung-Lu graph with Pareto(alpha=2.1) expected degrees; returns the incoming CSR (indptr, indices).

    Node weights are shuffled so that hubs get random gids (no locality: the pessimistic case for caches).
    Self-loops and duplicate edges are removed and rows are sorted, as in the canonical graph format.
    """
    rng = np.random.default_rng(seed)
    weight = (1.0 - rng.random(num_nodes)) ** (-1.0 / 1.1)           # Pareto tail, exponent 2.1
    weight = np.minimum(weight, weight.sum() ** 0.5)                 # cap hubs, as Chung-Lu needs w_max^2 <= sum w
    cdf = np.cumsum(weight / weight.sum())
    half = int(num_nodes * avg_degree / 2)
    key_parts = []
    for lo in range(0, half, 1 << 24):                               # chunks keep the float temporaries small
        n = min(1 << 24, half - lo)
        u_gid = np.minimum(np.searchsorted(cdf, rng.random(n)), num_nodes - 1)
        v_gid = np.minimum(np.searchsorted(cdf, rng.random(n)), num_nodes - 1)
        keep = u_gid != v_gid
        u_gid, v_gid = u_gid[keep], v_gid[keep]
        # both directions: key = target * N + source, so sorting the keys gives the incoming CSR in target order
        key_parts += [v_gid * num_nodes + u_gid, u_gid * num_nodes + v_gid]
    key = np.unique(np.concatenate(key_parts))
    del key_parts
    dst_gid, src_gid = np.divmod(key, num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst_gid, minlength=num_nodes), out=indptr[1:])
    return indptr, src_gid.astype(np.int64)


def load_partitioned(partition_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole-graph CSR in gid order and the bounds of a partition artifact (a pipeline's METIS parts);
    ``partition_dir``: ``<artifact root>/partition/<key>``."""
    from storage import ArtifactStore
    from storage.partition import PartitionArtifact, concat_parts

    root, stage, key = partition_dir.rstrip("/").rsplit("/", 2)
    store = ArtifactStore(root)
    partition = PartitionArtifact(store, store.load(stage, key))
    indptr, indices = concat_parts([partition.csr(p) for p in range(partition.num_partitions)])
    return indptr, indices, partition.bounds()


def add_graph_source_args(parser: argparse.ArgumentParser) -> None:
    """Where ``load_graph`` finds its graph: generated (its size), cached, or a partition artifact's."""
    parser.add_argument("--nodes", type=int, default=2_400_000)
    parser.add_argument("--avg-degree", type=float, default=50.0)
    parser.add_argument("--graph", help=".npz cache of the generated graph (read if it exists, else written)")
    parser.add_argument("--from-partition", help="a 2-partition artifact directory (artifacts/partition/<key>): "
                        "sample the pipeline's METIS parts; cached in --graph with their bounds")
    parser.add_argument("--generator", choices=["pipeline", "numpy"], default="pipeline",
                        help="stages.download.synthetic (communities, products-like) or the numpy Chung-Lu here")


def load_graph(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    if args.graph and os.path.exists(args.graph):
        with np.load(args.graph) as z:
            return z["indptr"], z["indices"]
    if args.from_partition:
        indptr, indices, bounds = load_partitioned(args.from_partition)
        if len(bounds) != 3:
            sys.exit("--from-partition needs a 2-partition artifact")
        if args.graph:
            Path(args.graph).parent.mkdir(parents=True, exist_ok=True)
            np.savez(args.graph, indptr=indptr, indices=indices, bounds=bounds)
        return indptr, indices
    if args.generator == "pipeline":   # the download stage's generator, so the graph matches the pipeline's
        from stages.download.synthetic import generate_synthetic

        graph = generate_synthetic(num_nodes=args.nodes, avg_degree=args.avg_degree, num_features=1,
                                   num_classes=47, seed=args.seed)   # products has 47 classes; features unused
        indptr, indices = graph.indptr.astype(np.int64), graph.indices.astype(np.int64)
    else:
        indptr, indices = power_law_graph(args.nodes, args.avg_degree, args.seed)
    if args.graph:
        Path(args.graph).parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.graph, indptr=indptr, indices=indices)
    return indptr, indices


def _train_gid(lo: int, hi: int, count: int, seed: int) -> np.ndarray:
    """``count`` distinct random gids of ``[lo, hi)``: this rank's stand-in train split."""
    rng = np.random.default_rng(seed)
    return lo + rng.permutation(hi - lo)[:min(count, hi - lo)]


def _run_batches(sampler, train_gid: np.ndarray, args: argparse.Namespace, device: str) -> dict:
    """Time ``args.batches`` batches after ``args.warmup`` ones.

    Process CPU time (all threads) is reported next to wall time, and the median and minimum per batch next to
    the mean: on a shared or oversubscribed box other tenants stretch wall time, not CPU time.
    """
    import torch

    from stages.runtime.sampling.sampler import iter_seed_batches

    gen = torch.Generator(device=device).manual_seed(args.seed)
    seed_batches = list(iter_seed_batches(torch.from_numpy(train_gid).to(device), args.batch_size, generator=gen,
                                          drop_last=True))
    for seed_gid in seed_batches[:args.warmup]:
        sampler.sample(seed_gid)
    timed = seed_batches[args.warmup:args.warmup + args.batches]
    _sync(device)
    edges = nodes = 0
    batch_s = []
    cpu_start = time.process_time()
    for seed_gid in timed:
        start = time.perf_counter()
        batch = sampler.sample(seed_gid)
        _sync(device)
        batch_s.append(time.perf_counter() - start)
        # a static batch counts its real edges and nodes, not its padded slots
        edges += int(batch.real_edges) if hasattr(batch, "real_edges") else batch.edge_index.shape[1]
        nodes += int(batch.real_nodes) if hasattr(batch, "real_nodes") else batch.num_nodes
    cpu_s = time.process_time() - cpu_start
    wall_s, num = sum(batch_s), len(batch_s)
    return {"batches_per_s": round(num / wall_s, 3), "sampled_edges_per_s": round(edges / wall_s),
            "sampled_edges_per_cpu_s": round(edges / cpu_s), "s_per_batch": round(wall_s / num, 4),
            "median_s_per_batch": round(float(np.median(batch_s)), 4), "min_s_per_batch": round(min(batch_s), 4),
            "cpu_s_per_batch": round(cpu_s / num, 4), "edges_per_batch": round(edges / num),
            "nodes_per_batch": round(nodes / num)}


class _Static:
    """The static-shape sampler (``stages.runtime.sampling.static_sampler``, eagerly: what ``cuda_graph=auto``
    captures) with the eager one's ``sample(seed_gid)``."""

    def __init__(self, csr: Any, args: argparse.Namespace, gen: Any) -> None:
        import torch

        from stages.runtime.sampling.static_sampler import StaticSampler
        from stages.runtime.sampling.static_shape import StaticShape

        shape = StaticShape.bound(args.batch_size, args.fanouts, csr.num_nodes)
        self.sampler = StaticSampler(csr, args.fanouts, shape, replace=args.replace, generator=gen)
        self.seed_buf = torch.zeros(args.batch_size, dtype=torch.long, device=csr.device)
        self.num_seeds = torch.zeros((), dtype=torch.long, device=csr.device)

    def sample(self, seed_gid: Any) -> Any:
        self.seed_buf[:seed_gid.numel()].copy_(seed_gid)
        self.num_seeds.fill_(seed_gid.numel())
        return self.sampler.sample(self.seed_buf, self.num_seeds)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_single(args: argparse.Namespace, indptr: np.ndarray, indices: np.ndarray, threads: int) -> dict:
    import torch

    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.sampler import NeighborSampler

    torch.set_num_threads(threads)
    csr = LocalCSR.from_numpy(indptr, indices, 0)
    # the CSR in device memory, or pinned in host memory and read by the GPU in place (the train stage's
    # graph_placement, issue [4/5] item 7)
    csr = csr.pinned_on(torch.device(args.device)) if args.graph_placement == "uva" else csr.to_device(args.device)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    sampler: Any = NeighborSampler(csr, args.fanouts, replace=args.replace, generator=gen, node_map=args.node_map)
    if args.static:
        sampler = _Static(csr, args, gen)
    need = (args.batches + args.warmup) * args.batch_size
    return _run_batches(sampler, _train_gid(0, csr.num_nodes, need, args.seed), args, args.device)


def _dist_worker(rank: int, args: argparse.Namespace, init_file: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.dist_sampler import DistNeighborSampler

    torch.set_num_threads(args.threads_per_rank)
    device, backend = "cpu", "gloo"
    if args.device == "cuda":   # one GPU per rank when there are two, else both ranks share one over gloo (NCCL
        # refuses two ranks on one GPU: "Duplicate GPU detected", seen on an H200)
        gpus = torch.cuda.device_count()
        device, backend = f"cuda:{rank % gpus}", "nccl" if gpus >= 2 else "gloo"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=2)
    with np.load(args.graph) as z:
        indptr = z["indptr"]
        # the partition's own bounds if the graph came from a partition artifact, else two contiguous halves
        # (of a randomly numbered graph: a random partition, the pessimistic case for traffic)
        bounds = z["bounds"] if "bounds" in z else np.array([0, (indptr.shape[0] - 1) // 2, indptr.shape[0] - 1],
                                                             dtype=np.int64)
        lo, hi = bounds[rank], bounds[rank + 1]
        part_indices = z["indices"][indptr[lo]:indptr[hi]].copy()   # each rank keeps only its half
        part_indptr = indptr[lo:hi + 1] - indptr[lo]
    csr = LocalCSR.from_numpy(part_indptr, part_indices, int(lo), device)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)
    sampler = DistNeighborSampler(csr, bounds, args.fanouts, replace=args.replace, generator=gen,
                                  node_map=args.node_map, num_edges=int(indptr[-1]))
    batches: Any = sampler
    if args.edge_features:
        own_attr = torch.rand(part_indices.shape[0], args.edge_features, device=device)
        sampler.with_edges = True
        if args.edge_path == "ride":
            sampler.edge_attr = own_attr
        else:
            batches = _GatherEdgeAttr(sampler, [int(indptr[b]) for b in bounds], own_attr, device)
    need = (args.batches + args.warmup) * args.batch_size
    dist.barrier()
    stats = {**_run_batches(batches, _train_gid(int(lo), int(hi), need, args.seed + rank), args, device),
             "backend": backend}
    dist.barrier()
    Path(out_dir, f"{rank}.json").write_text(json.dumps(stats))
    dist.destroy_process_group()


class _GatherEdgeAttr:
    """``--edge-path gather``, the design the sampler's ride-along replaced: ``e_id`` from the sampler, then every
    edge's row gathered by egid from its owner through ``DistFeatures`` over the edge bounds (3 more collectives)."""

    def __init__(self, sampler: Any, edge_bounds: list[int], own_attr: Any, device: str) -> None:
        from stages.runtime.dist_features import DistFeatures
        from stages.runtime.feature_store import InMemoryFeatureStore

        self.sampler = sampler
        self.rows = DistFeatures(InMemoryFeatureStore(own_attr), edge_bounds, device=device)

    def sample(self, seed_gid):
        batch = self.sampler.sample(seed_gid)
        batch.edge_attr = self.rows.gather(batch.e_id)
        return batch


def _pair_worker(rank: int, args: argparse.Namespace, out_dir: str) -> None:
    """Control for dist mode: an independent single-partition sampler, one per core, side by side."""
    indptr, indices = load_graph(args)
    stats = run_single(args, indptr, indices, args.threads_per_rank)
    Path(out_dir, f"{rank}.json").write_text(json.dumps(stats))


def run_pair(args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_pair_worker, args=(args, tmp), nprocs=2, join=True)
        per_proc = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(2)]
    return {key: max(r[key] for r in per_proc)
            for key in ("s_per_batch", "median_s_per_batch", "min_s_per_batch", "cpu_s_per_batch")}


def run_dist(args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_dist_worker, args=(args, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        per_rank = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(2)]
    slowest = {key: max(r[key] for r in per_rank)
               for key in ("s_per_batch", "median_s_per_batch", "min_s_per_batch", "cpu_s_per_batch")}
    return {"per_rank": per_rank, **slowest,
            "sampled_edges_per_s_total": sum(r["sampled_edges_per_s"] for r in per_rank)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_source_args(parser)
    parser.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--threads-per-rank", type=int, default=None, help="dist mode; default threads // 2")
    parser.add_argument("--mode", choices=["single", "dist"], default="single")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--graph-placement", choices=["device", "uva"], default="device",
                        help="single mode on cuda: the CSR in device memory, or pinned host memory read in place")
    parser.add_argument("--replace", action="store_true")
    parser.add_argument("--static", action="store_true", help="single mode: the static-shape sampler of "
                                                              "cuda_graph=auto, run eagerly (no host read)")
    parser.add_argument("--edge-features", type=int, default=0, help="dist mode: batches also carry e_id and this "
                        "many float32 edge features a sampled edge (0: neither)")
    parser.add_argument("--edge-path", choices=["ride", "gather"], default="ride", help="edge features: sent with "
                        "the sampler's answers (the runtime's way) or gathered by e_id from their owners afterwards")
    parser.add_argument("--node-map", choices=["auto", "dense", "sorted"], default="auto")
    parser.add_argument("--no-baseline", action="store_true", help="dist mode: skip the single-partition baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prepare-only", action="store_true",
                        help="only make the --graph cache (make gpu-check does it while the CUDA tests run)")
    args = parser.parse_args()
    args.threads_per_rank = args.threads_per_rank or max(1, args.threads // 2)

    start = time.perf_counter()
    indptr, indices = load_graph(args)
    result = {"mode": args.mode, "device": args.device, "nodes": int(indptr.shape[0] - 1),
              "edges": int(indices.shape[0]), "fanouts": args.fanouts, "batch_size": args.batch_size,
              "batches": args.batches, "replace": args.replace, "node_map": args.node_map,
              "graph_placement": args.graph_placement, "static": args.static,
              "edge_features": args.edge_features, "edge_path": args.edge_path,
              "load_s": round(time.perf_counter() - start, 1)}
    if args.prepare_only:
        print(json.dumps(result), flush=True)
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this host has no GPU (torch sees none); use --device cpu")
    if args.graph_placement == "uva" and (args.mode, args.device) != ("single", "cuda"):
        parser.error("--graph-placement uva reads a pinned CSR from a GPU: it needs --mode single --device cuda")
    if args.mode == "single":
        result.update(threads=args.threads, **run_single(args, indptr, indices, args.threads))
    else:
        if not args.graph:
            parser.error("--mode dist needs --graph (the ranks load their halves from it)")
        result.update(threads_per_rank=args.threads_per_rank, **run_dist(args))
        if not args.no_baseline:   # same threads per process, whole graph in one process
            base = run_single(args, indptr, indices, args.threads_per_rank)
            result["baseline_single"] = base
            # and two such processes side by side: what sharing the machine costs without any communication
            pair = run_pair(args)
            result["baseline_pair"] = pair
            for key in ("s_per_batch", "median_s_per_batch", "min_s_per_batch", "cpu_s_per_batch"):
                result[f"dist_overhead_{key}"] = round(result[key] / base[key], 3)
                result[f"dist_overhead_vs_pair_{key}"] = round(result[key] / pair[key], 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
