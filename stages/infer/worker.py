"""One inference rank: ``python -m stages.infer.worker --spec JOB.json``, started by the job's agent (one per
partition).

The entry point only, as ``stages.train.rank.worker`` is for training (both run in ``stages.runtime.rank_process``,
which prefixes their lines and records their errors): the rank's device (``infer_device``: a GPU per rank when
there are enough), the gloo process group (the exchange stays in host memory, on a GPU rank too), the rank's threads,
then ``rank.infer_rank``; rank 0 gathers every rank's figures into ``ranks.json`` for the stage. The process ends with
``os._exit`` (see ``stages.train.rank.worker``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stages.infer.params import Params
from stages.infer.rank import infer_rank
from stages.infer.spec import InferSpec
from stages.jobs.cluster import rank_threads
from stages.runtime.rank_process import init_method, rank_env, run_rank
from storage import GnnpipeError, InputError
from storage.infer import ranks_path
from storage.train import atomic_write_bytes
from storage.write_errors import write_failure


def infer_device(setting: str, local_rank: int, local_world: int) -> torch.device:
    """``auto``: a GPU per rank when the host has enough, else the CPU (as training picks); ``cuda``: the host's GPUs
    shared evenly among its ranks. Unlike training's NCCL, the exchange here is gloo's on the host, which does not
    mind two ranks on one GPU; a rank's layer steps take what its share of the free memory holds."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if setting == "cpu" or (setting == "auto" and gpus < local_world):
        return torch.device("cpu")
    if not gpus:
        raise InputError("infer.device=cuda, but this host has no GPU: set infer.device=cpu (or auto)")
    index = local_rank * gpus // local_world
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def infer(spec: InferSpec, rank: int, world: int, local_rank: int, local_world: int) -> None:
    """Run global rank ``rank`` of the job to the end: its outputs written, rank 0's ``ranks.json`` too."""
    params = Params(**spec.params)
    device = infer_device(params.device, local_rank, local_world)
    torch.set_num_threads(rank_threads(params.threads_per_rank, local_world))
    dist.init_process_group("gloo", init_method=init_method(), timeout=timedelta(seconds=params.peer_timeout_s))
    record = infer_rank(spec, rank, world, local_world, device)
    records: list[Any] = [None] * world
    dist.all_gather_object(records, record)
    if rank == 0:
        atomic_write_bytes(ranks_path(spec.result_dir), json.dumps(records, indent=2).encode())
    dist.barrier()


def _refused_write(spec_path: str, err: BaseException) -> GnnpipeError | None:
    """One line for a write of this rank's outputs that the file system refused under the artifact root (a full
    disk, a quota), or None (``storage.write_errors``)."""
    try:
        root = InferSpec.load(spec_path).artifacts
    except GnnpipeError:   # no spec to name the root by: the traceback it is
        return None
    return write_failure(err, "infer", root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of the gnnpipe infer stage (run by torchrun)")
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    env = rank_env()
    return run_rank(args.spec, env, lambda: infer(InferSpec.load(args.spec), env.rank, env.world, env.local_rank,
                                                   env.local_world),
                    refused=lambda err: _refused_write(args.spec, err))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # skip interpreter teardown of torch.distributed state (see stages.train.rank.worker)
