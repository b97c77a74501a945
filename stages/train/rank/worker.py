"""One training rank: ``python -m stages.train.rank.worker --spec JOB.json``, started by torchrun (one per partition).

The entry point only: it starts the process group on the chosen device, sizes the rank's threads, refuses to
train unless every node reads the same builds of the same artifacts, then rank r opens partition r
(``rank_data.RankData``: CSR, labels, splits, its feature store and its cache plan) and runs the
``trainer.Trainer`` (model in DDP, equal-count batches from ``loader``, metrics all-reduced by ``stats``,
checkpoints by ``checkpoint``, per-epoch reseeding of every random stream by ``rng``).

Local rank 0 of every node writes ``model.pt`` and ``metrics.json`` (identical everywhere: DDP keeps the weights
equal and every metric is all-reduced), so the node that publishes has them whichever global ranks torchrun gave
it. The rank runs in ``stages.runtime.rank_process`` (``[rank r]`` line prefixes, ``error-<r>.json`` for the
launcher, one line for a user error); the process ends with ``os._exit`` (see ``train``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stages.jobs.cluster import rank_threads
from stages.runtime.rank_process import init_method, rank_env, run_rank
from stages.train.params import Params
from stages.train.rank.cache_budget import ranks_sharing_gpu
from stages.train.rank.faults import fault_hook
from stages.train.rank.guard import PeerStoppedError
from stages.train.rank.prefetch import producer_group
from stages.train.rank.rank_data import RankData
from stages.train.rank.trainer import Trainer
from stages.train.spec import TrainSpec, check_same_artifacts
from storage import GnnpipeError, InputError
from storage.train import write_result
from storage.write_errors import write_failure


def pick_device(params: Params, local_rank: int, local_world: int) -> torch.device:
    """One GPU per rank when there are enough (NCCL refuses two ranks on one GPU), or ``ranks_per_gpu`` ranks on each
    (over gloo: ``rank_backend``), else the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    share = ranks_sharing_gpu(params, local_world)
    needed = -(-local_world // share)
    if params.device == "cpu" or (params.device == "auto" and gpus < needed):
        if gpus and params.device == "auto":
            print(f"{gpus} GPU(s) for {local_world} ranks on this host: training on the CPU (NCCL needs one GPU "
                  f"per rank; set device=cuda to make this an error)", flush=True)
        return torch.device("cpu")
    if gpus == 0:
        raise InputError("device=cuda, but this host has no GPU: set device=cpu (or auto)")
    if gpus < needed:
        fix = (f"; tests and benchmarks can share one over gloo: ranks_per_gpu={local_world}" if share == 1 else
               f" at ranks_per_gpu={share}")
        raise InputError(f"device=cuda needs {needed} GPU(s) for {local_world} ranks on this host, which has "
                         f"{gpus}{fix}")
    index = local_rank // share
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def rank_backend(params: Params, device: torch.device, local_world: int) -> str:
    """NCCL for one rank per GPU, gloo on a CPU and for ranks sharing a GPU (it moves CUDA tensors; NCCL refuses).
    Every rank of a job must pick the same: ``local_world`` is the same on every node (``Cluster`` refuses uneven
    ranks per node), and ranks on different kinds of device (``device=auto`` on nodes with different GPU counts)
    are refused before the group starts (``join_process_group``)."""
    return "nccl" if device.type == "cuda" and ranks_sharing_gpu(params, local_world) == 1 else "gloo"


def join_process_group(params: Params, device: torch.device, local_world: int) -> None:
    """``init_process_group`` on ``rank_backend``, once every rank has said where it trains (``same_device_kind``
    on the rendezvous's own store): NCCL ranks and gloo ranks would each wait for the other in their first
    collective until ``peer_timeout_s``, a hang with no cause named."""
    timeout = timedelta(seconds=params.peer_timeout_s)
    store, rank, world = next(dist.rendezvous(init_method() or "env://", timeout=timeout))
    store.set_timeout(timeout)
    # one attempt per store: the launchers run torchrun with --max-restarts=0 (a restarted attempt could read its
    # predecessor's keys, and each node's agent counts its own restarts: no job-wide attempt number to key them on)
    same_device_kind(dist.PrefixStore("gnnpipe_device", store), rank, world, device.type, host=os.uname().nodename,
                     setting=params.device)
    # the prefix init_process_group gives a store it makes itself: the group's keys are those it always had
    dist.init_process_group(rank_backend(params, device, local_world), store=dist.PrefixStore("default_pg", store),
                            rank=rank, world_size=world, timeout=timeout)


def same_device_kind(store: dist.Store, rank: int, world: int, kind: str, *, host: str, setting: str) -> None:
    """Every rank posts its device's kind (``cuda``, ``cpu``) and host to ``store`` and reads the others': an
    InputError (the same line on every rank) when they differ, which ``device=auto`` does on nodes with different
    GPU counts."""
    store.set(str(rank), f"{kind} {host}")
    keys = [str(r) for r in range(world)]
    store.wait(keys)
    hosts_of: dict[str, set[str]] = {}
    for said in store.multi_get(keys):   # one round trip, where a get a rank was world of them on every rank
        other_kind, other_host = said.decode().split(" ", 1)
        hosts_of.setdefault(other_kind, set()).add(other_host)
    if len(hosts_of) > 1:
        # every rank reads before any leaves: under plain env:// rank 0 hosts the store, and its exit would turn
        # the others' reads into connection errors (a rank that died meanwhile only costs the store's timeout)
        store.set(f"read/{rank}", "")
        with contextlib.suppress(dist.DistError):
            store.wait([f"read/{r}" for r in range(world)])
        where = "; ".join(f"{'GPUs' if k == 'cuda' else k.upper()} on {', '.join(sorted(h))}"
                          for k, h in sorted(hosts_of.items(), reverse=True))
        raise InputError(f"device={setting} put this job's ranks on different kinds of device ({where}): one job "
                         f"trains on one kind; set device=cpu, or run on nodes that each have a GPU per rank")


def train(spec: TrainSpec, rank: int, world: int, local_rank: int, local_world: int) -> None:
    """Run global rank ``rank`` of the job in ``spec`` to the end, results written and every rank done."""
    params = Params(**spec.params)
    device = pick_device(params, local_rank, local_world)
    torch.set_num_threads(rank_threads(params.threads_per_rank, local_world))
    join_process_group(params, device, local_world)
    check_same_inputs(spec, rank, world)
    data = RankData.open(spec, rank, world, local_world, device,
                         group=producer_group(params.prefetch_depth(device.type, world)))
    trainer = Trainer(spec, params, data, local_rank=local_rank, local_world=local_world, batch_hook=fault_hook)
    metrics = trainer.fit()
    state = trainer.published_state()   # a collective: the embedding shards are gathered
    if local_rank == 0:   # every node: the publishing node may host any global rank
        if trainer.embeddings:
            state = data.in_dataset_order(state)
        write_result(spec.result_dir, state, metrics)
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


def refused_write(spec_path: str, err: BaseException) -> GnnpipeError | None:
    """One line for a write the file system refused in the job directory (checkpoints, results: a full disk, a
    quota), or None: the rank's user error, which the launcher repeats, rather than a traceback."""
    try:
        job = json.loads(Path(spec_path).read_text())["checkpoint_dir"]
    except Exception:  # noqa: BLE001 - no spec to name the directory by: the traceback it is
        return None
    failure = write_failure(err, "train", job)
    if failure is None:
        return None
    return type(failure)(f"{failure} (the checkpoints written so far were kept: a rerun resumes)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of the gnnpipe train stage (run by torchrun)")
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    env = rank_env()
    return run_rank(args.spec, env, lambda: train(TrainSpec.load(args.spec), env.rank, env.world, env.local_rank,
                                                   env.local_world),
                    refused=lambda err: refused_write(args.spec, err),
                    quiet=(PeerStoppedError,))   # the rank that caused it says why, in one line


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # skip interpreter teardown of torch.distributed state (see train())
