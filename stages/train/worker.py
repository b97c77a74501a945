"""One training rank: ``python -m stages.train.worker --spec JOB.json``, started by torchrun (one per partition).

Rank r loads partition r (CSR, labels, splits, its feature store and its cache plan), builds the model wrapped in
DDP, and trains on its own train nodes in equal-count batches; validation each epoch and the test at the end are
all-reduced over ranks. Local rank 0 of every node checkpoints every epoch (atomically) and writes ``model.pt``
and ``metrics.json`` (identical everywhere: DDP keeps the weights equal and every metric is all-reduced), so the
node that publishes has them whichever global ranks torchrun gave it.

Determinism: every random stream (shuffle, sampler, dropout, python/numpy) is reseeded at the start of each epoch
from ``(seed, rank, epoch)``, so a run resumed after epoch e draws exactly what an uninterrupted run draws in epoch
e+1; the checkpoint also stores every rank's RNG states. Stdout/stderr lines carry a ``[rank r]`` prefix, and a
failing rank writes ``error-<r>.json`` so that the launcher can name it and repeat a user error's message.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from storage import ArtifactStore, GnnpipeError, InputError
from storage.features import part_store, read_part_features
from storage.partition import BOOK, part_name, read_part
from storage.train import METRICS, MODEL, atomic_write_bytes, load_latest_checkpoint, save_checkpoint, torch_bytes
from storage.zarr_io import open_group, read_array
from stages.runtime.dist_features import DistFeatures
from stages.runtime.dist_sampler import DistNeighborSampler, comm_device, equal_batch_count, iter_equal_seed_batches
from stages.runtime.feature_store import open_feature_store
from stages.runtime.sampler import LocalCSR
from stages.train.cache_policy import cache_gids, resolve_policy
from stages.train.cluster import rank_threads
from stages.train.loop import ogb_accuracy_counts, predict, train_epoch
from stages.train.model import build_model
from stages.train.params import Params
from stages.train.spec import TrainSpec, check_lineage, check_same_artifacts, check_world_size

# Test-only fault injection, "rank:epoch:batch": that rank SIGKILLs itself before that batch (0-based).
FAULT_ENV = "GNNPIPE_TRAIN_FAULT"
STREAM_SHUFFLE, STREAM_SAMPLER, STREAM_TORCH, STREAM_PY = range(4)


class LinePrefixer:
    """A text stream that starts every line with ``prefix`` (prints, logging, warnings and tracebacks alike)."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self.stream, self.prefix, self._at_line_start = stream, prefix, True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start:
                pieces.append(self.prefix)
            pieces.append(piece)
            self._at_line_start = piece.endswith("\n")
        self.stream.write("".join(pieces))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def stream_seed(seed: int, rank: int, epoch: int, stream: int) -> int:
    """A 63-bit seed per (seed, rank, epoch, stream): independent streams, reproducible anywhere."""
    return int(np.random.SeedSequence([seed, rank, epoch, stream]).generate_state(1, dtype=np.uint64)[0] >> 1)


class Rank:
    """What rank r holds: its partition, feature path, sampler, model and optimiser."""

    def __init__(self, spec: TrainSpec, params: Params, rank: int, world: int, local_world: int,
                 device: torch.device, local_rank: int = 0) -> None:
        self.spec, self.params, self.rank, self.world, self.device = spec, params, rank, world, device
        self.local_rank = local_rank   # which rank of its node: local rank 0 keeps the node's results
        store = ArtifactStore(spec.artifacts)
        partition, features, hotness = (store.load(stage, key) for stage, key in (
            ("partition", spec.partition_key), ("features", spec.features_key), ("hotness", spec.hotness_key)))
        check_lineage(partition, features, hotness)
        check_world_size(world, spec.num_partitions)
        bounds = read_array(open_group(store.url("partition", spec.partition_key, BOOK)), "bounds")
        check_world_size(world, int(bounds.shape[0]) - 1)
        self.lo = int(bounds[rank])
        csr = LocalCSR.from_part(read_part(store.url("partition", spec.partition_key, part_name(rank))), device)
        feat_url = store.url("features", spec.features_key, part_store(rank))
        part = read_part_features(feat_url, load_x=False)
        x_store = open_feature_store(feat_url, memory_budget_bytes=params.host_memory_budget_bytes,
                                     ranks_on_host=local_world, pin=device.type == "cuda")
        self.features = DistFeatures(x_store, bounds, device=device)
        start = time.perf_counter()
        self.cache_policy = resolve_policy(params.cache_policy, device.type)
        gid = cache_gids(self.cache_policy, store=store, partition_key=spec.partition_key,
                         hotness_key=spec.hotness_key, rank=rank, num_partitions=spec.num_partitions)
        cache = self.features.build_cache(torch.from_numpy(gid))
        self.setup = {"rank": rank, "feature_store": x_store.kind, "cache_rows": cache.num_rows,
                      "cache_bytes": cache.nbytes, "cache_build_s": round(time.perf_counter() - start, 3),
                      **{f"{s}_nodes": int(part.split_lids[s].shape[0]) for s in ("train", "valid", "test")}}
        self.y_local = torch.from_numpy(part.y).to(device)
        self.split_gid = {s: torch.from_numpy(part.split_lids[s] + self.lo).to(device) for s in part.split_lids}
        self.shuffle_gen = torch.Generator(device=device)
        self.sampler_gen = torch.Generator(device=device)
        self.sampler = DistNeighborSampler(csr, bounds, params.fanouts, generator=self.sampler_gen)
        torch.manual_seed(params.seed)   # same initial weights everywhere (DDP also broadcasts rank 0's)
        self.num_classes = int(part.attrs["num_classes"])
        self.model = build_model(params.model, in_channels=x_store.num_features, hidden=params.hidden,
                                 out_channels=self.num_classes, num_layers=params.num_layers,
                                 dropout=params.dropout, heads=params.gat_heads).to(device)
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.optimizer = torch.optim.Adam(self.ddp.parameters(), lr=params.lr, weight_decay=params.weight_decay)

    def label_of(self, seed_gid: Tensor) -> Tensor:
        return self.y_local.index_select(0, seed_gid - self.lo)

    # ---- randomness ----------------------------------------------------------------------------------------
    def seed_epoch(self, epoch: int) -> None:
        seed = self.params.seed
        self.shuffle_gen.manual_seed(stream_seed(seed, self.rank, epoch, STREAM_SHUFFLE))
        self.sampler_gen.manual_seed(stream_seed(seed, self.rank, epoch, STREAM_SAMPLER))
        torch.manual_seed(stream_seed(seed, self.rank, epoch, STREAM_TORCH))
        py_seed = stream_seed(seed, self.rank, epoch, STREAM_PY)
        random.seed(py_seed)
        np.random.seed(py_seed % 2**32)

    def rng_state(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                 "shuffle": self.shuffle_gen.get_state(), "sampler": self.sampler_gen.get_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        self.shuffle_gen.set_state(state["shuffle"])
        self.sampler_gen.set_state(state["sampler"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)

    # ---- collectives ---------------------------------------------------------------------------------------
    def all_reduce(self, values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=comm_device())
        dist.all_reduce(t, op=op)
        return t.tolist()

    def eval_batches(self, split: str) -> list[Tensor]:
        """The split's own nodes in order, then empty batches up to the largest rank's count (lockstep)."""
        seed_gid, bs = self.split_gid[split], self.params.batch_size
        total = equal_batch_count(seed_gid.numel(), bs)
        return [seed_gid[b * bs:(b + 1) * bs] for b in range(total)]

    def accuracy(self, split: str) -> float:
        seed_gid, y_pred = predict(self.model, self.eval_batches(split), self.sampler.sample, self.features.gather,
                                   self.device)
        correct, total = ogb_accuracy_counts({"y_true": self.label_of(seed_gid)[:, None], "y_pred": y_pred[:, None]})
        correct, total = self.all_reduce([correct, total])
        return correct / total if total else 0.0


def fault_hook(rank: int, epoch: int) -> Callable[[int], None] | None:
    """The test-only ``FAULT_ENV`` hook for this rank and epoch, if any: a hard death, as a crashed node would."""
    fault = os.environ.get(FAULT_ENV)
    if not fault:
        return None
    f_rank, f_epoch, f_batch = (int(v) for v in fault.split(":"))
    if (f_rank, f_epoch) != (rank, epoch):
        return None

    def die(batch: int) -> None:
        if batch == f_batch:
            print(f"fault injection: rank {rank} (pid {os.getpid()}) kills itself at epoch {epoch} batch {batch}",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return die


def resume_state(r: Rank) -> dict[str, Any] | None:
    """The newest checkpoint any node holds, broadcast to every rank (no shared file system needed).

    Each node's local rank 0 writes checkpoints to its own directory, and torchrun may hand a node other global
    ranks on the next attempt (c10d orders nodes by address), so the ranks agree here on the newest one.
    """
    ckpt = None
    if r.local_rank == 0:
        ckpt = load_latest_checkpoint(r.spec.checkpoint_dir)
        if ckpt is not None and ckpt.get("key") != r.spec.key:
            print(f"ignoring {r.spec.checkpoint_dir}: its checkpoint belongs to run {ckpt.get('key')}", flush=True)
            ckpt = None
    epochs: list[Any] = [None] * r.world
    dist.all_gather_object(epochs, -1 if ckpt is None else int(ckpt["epoch"]))
    newest = max(range(r.world), key=lambda k: (epochs[k], -k))
    if epochs[newest] < 0:
        return None
    holder = [ckpt if r.rank == newest else None]
    dist.broadcast_object_list(holder, src=newest)
    return holder[0]


def fit(r: Rank) -> dict[str, Any]:
    """Train (resuming from the newest checkpoint), evaluate, and return the metrics (equal on every rank)."""
    spec, params = r.spec, r.params
    ckpt = resume_state(r)
    history: list[dict[str, Any]] = []
    start_epoch, resumed_from = 0, None
    if ckpt is not None:
        r.model.load_state_dict(ckpt["model"])
        r.optimizer.load_state_dict(ckpt["optimizer"])
        r.set_rng_state(ckpt["rng"][r.rank])
        history, resumed_from = ckpt["history"], int(ckpt["epoch"])
        start_epoch = resumed_from + 1
        print(f"resuming from the checkpoint after epoch {resumed_from}", flush=True)
    setup: list[Any] = [None] * r.world
    dist.all_gather_object(setup, r.setup)
    num_real = math.ceil(setup[r.rank]["train_nodes"] / params.batch_size)
    row_bytes = r.features.store.row_bytes
    for epoch in range(start_epoch, params.epochs):
        r.seed_epoch(epoch)
        r.features.reset_counters()
        batches = iter_equal_seed_batches(r.split_gid["train"], params.batch_size, generator=r.shuffle_gen)
        sums = train_epoch(r.ddp, r.optimizer, batches, r.sampler.sample, r.features.gather, r.label_of,
                           num_real_batches=num_real, device=r.device, on_batch=fault_hook(r.rank, epoch))
        traffic = r.features.reset_counters()
        eval_start = time.perf_counter()
        val_acc = r.accuracy("valid")
        eval_s = time.perf_counter() - eval_start
        loss_sum, correct, seeds, edges, req, hits, local, remote, remote_bytes = r.all_reduce(
            [sums.loss_sum, sums.correct, sums.seeds, sums.sampled_edges, traffic.requested_rows,
             traffic.cache_hits, traffic.local_rows, traffic.remote_rows, traffic.remote_bytes])
        epoch_s, eval_s = r.all_reduce([sums.wall_s, eval_s], op=dist.ReduceOp.MAX)
        row = {"epoch": epoch, "loss": loss_sum / max(seeds, 1), "train_acc": correct / max(seeds, 1),
               "val_acc": val_acc, "epoch_s": epoch_s, "eval_s": eval_s, "batches": sums.batches,
               "sampled_edges_per_s": edges / max(epoch_s, 1e-9), "hit_rate": hits / max(req, 1),
               "requested_rows": int(req), "cached_rows": int(hits), "local_rows": int(local),
               "remote_rows": int(remote), "cached_bytes": int(hits) * row_bytes,
               "local_bytes": int(local) * row_bytes, "remote_bytes": int(remote_bytes)}
        history.append(row)
        rng = [None] * r.world
        dist.all_gather_object(rng, r.rng_state())
        if r.local_rank == 0:   # every node keeps its own copy (see resume_state)
            save_checkpoint(spec.checkpoint_dir, epoch, {
                "key": spec.key, "epoch": epoch, "model": r.model.state_dict(),
                "optimizer": r.optimizer.state_dict(), "rng": rng, "history": history})
        if r.rank == 0:
            print(f"epoch {epoch + 1}/{params.epochs}: loss {row['loss']:.4f}, train {100 * row['train_acc']:.1f} %, "
                  f"val {100 * val_acc:.1f} % | {epoch_s:.2f} s, {row['sampled_edges_per_s'] / 1e6:.2f} M edges/s | "
                  f"cache hit {100 * row['hit_rate']:.1f} %, remote {int(remote):,} rows "
                  f"({remote_bytes / 2**20:.1f} MiB)", flush=True)
    r.seed_epoch(params.epochs)   # the test pass draws its own reproducible stream
    test_acc = r.accuracy("test")
    best = max(history, key=lambda h: h["val_acc"]) if history else {"val_acc": 0.0, "epoch": -1}
    return {"epochs": history, "test_acc": test_acc, "best_val_acc": best["val_acc"], "best_epoch": best["epoch"],
            "final_val_acc": history[-1]["val_acc"] if history else 0.0, "world_size": r.world,
            "resumed_from_epoch": resumed_from, "ranks": setup,
            "model": {"kind": params.model, "in_channels": r.features.num_features, "hidden": params.hidden,
                      "out_channels": r.num_classes, "num_layers": params.num_layers,
                      "parameters": sum(p.numel() for p in r.model.parameters())},
            "cache_policy": r.cache_policy, "device": str(r.device), "backend": dist.get_backend()}


def pick_device(params: Params, local_rank: int, local_world: int) -> torch.device:
    """One GPU per rank when there are enough (NCCL refuses two ranks on one GPU), else the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if params.device == "cpu" or (params.device == "auto" and gpus < local_world):
        if gpus and params.device == "auto":
            print(f"{gpus} GPU(s) for {local_world} ranks on this host: training on the CPU (NCCL needs one GPU "
                  f"per rank; set device=cuda to make this an error)", flush=True)
        return torch.device("cpu")
    if gpus < local_world:
        raise InputError(f"device=cuda needs one GPU per rank: {local_world} ranks, {gpus} GPUs on this host")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def train(spec: TrainSpec, rank: int, world: int, local_rank: int, local_world: int) -> None:
    params = Params(**spec.params)
    device = pick_device(params, local_rank, local_world)
    torch.set_num_threads(rank_threads(params.threads_per_rank, local_world))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=params.collective_timeout_s))
    check_same_inputs(spec, rank, world)
    r = Rank(spec, params, rank, world, local_world, device, local_rank)
    metrics = fit(r)
    if local_rank == 0:   # every node: the publishing node may host any global rank
        out = Path(spec.result_dir)
        state = {k: v.detach().cpu() for k, v in r.model.state_dict().items()}
        atomic_write_bytes(out / MODEL, torch_bytes(state))
        atomic_write_bytes(out / METRICS, json.dumps(metrics, indent=2, sort_keys=True).encode())
    dist.barrier()
    # No destroy_process_group: the process ends with os._exit (see the bottom of this module). Tearing down DDP's
    # reducer and the gloo group was seen to deadlock (~ProcessGroupGloo joins its run loop while holding the GIL
    # that the loop's last work object needs), and a rank about to exit has nothing worth releasing.


def check_same_inputs(spec: TrainSpec, rank: int, world: int) -> None:
    """Refuse to train unless every node reads the same builds of the same artifacts (``TrainSpec.fingerprint``)."""
    records: list[Any] = [None] * world
    dist.all_gather_object(records, {"rank": rank, "node": spec.node_rank, "host": os.uname().nodename,
                                     "fingerprint": spec.fingerprint})
    check_same_artifacts(records)


def write_error(spec_path: str, rank: int, err: BaseException) -> None:
    try:
        result_dir = json.loads(Path(spec_path).read_text())["result_dir"]
        record = {"rank": rank, "type": type(err).__name__, "user_error": isinstance(err, GnnpipeError),
                  "message": str(err).splitlines()[0] if str(err) else type(err).__name__}
        atomic_write_bytes(Path(result_dir) / f"error-{rank}.json", json.dumps(record).encode())
    except Exception:  # noqa: BLE001 - the log line is what matters; the file only helps the launcher
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of the gnnpipe train stage (run by torchrun)")
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    sys.stdout = LinePrefixer(sys.stdout, f"[rank {rank}] ")   # type: ignore[assignment]
    sys.stderr = LinePrefixer(sys.stderr, f"[rank {rank}] ")   # type: ignore[assignment]
    print(f"pid {os.getpid()}, world size {world}, host {os.uname().nodename}", flush=True)
    try:
        train(TrainSpec.load(args.spec), rank, world, local_rank, local_world)
    except GnnpipeError as err:
        write_error(args.spec, rank, err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except BaseException as err:  # noqa: BLE001 - report every crash with the rank's prefix, then fail
        traceback.print_exc()
        write_error(args.spec, rank, err)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # skip interpreter teardown of torch.distributed state (see train())
