"""A training run's checkpoints: atomic save, list and load, and the ranks' agreement on which one to resume.

Files: one per checkpoint in the job directory (names and place: ``storage.train``), each written to a temporary
name and ``os.replace``d into place, so a killed writer never leaves a truncated checkpoint under a valid name; the
``KEEP_CHECKPOINTS`` newest are kept. Contents (``torch.save`` of a dict)::

    {"key": train artifact key, "epoch": last completed epoch (0-based), "model": state_dict,
     "optimizer": state_dict, "scheduler": the LR scheduler's state_dict or None,
     "best": {"epoch", "val", "state": the best-validation weights (CPU)} (stages.train.recipe.BestModel),
     "ranks": [per global rank: {"rng": its RNG states, "embeddings": its embedding shards and their SparseAdam
               state, "best_embeddings": its shards of the best epoch}], "history": [per-epoch metrics]}

Each node's local rank 0 writes to its own directory (no shared file system needed), and torchrun may hand a node
other global ranks on the next attempt (c10d orders nodes by address): ``resume_state`` makes the ranks agree on
the newest checkpoint any node holds and broadcasts it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from storage.train import atomic_write_bytes, checkpoint_path, list_checkpoints, torch_bytes

KEEP_CHECKPOINTS = 2


def save_checkpoint(directory: str | os.PathLike[str], epoch: int, state: dict[str, Any],
                    keep: int = KEEP_CHECKPOINTS) -> Path:
    """Write ``state`` as the checkpoint after ``epoch`` (0-based, completed) and drop all but the ``keep`` newest."""
    path = checkpoint_path(directory, epoch)
    atomic_write_bytes(path, torch_bytes(state))
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_latest_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest checkpoint that loads, or None. An unreadable one (a disk error; renames are atomic) is skipped
    in favour of the one before: losing an epoch beats failing the run."""
    for _, path in reversed(list_checkpoints(directory)):
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - any unreadable file: fall back to the previous checkpoint
            continue
    return None


def resume_state(directory: str | os.PathLike[str], key: str, *, rank: int, world: int,
                 local_rank: int) -> dict[str, Any] | None:
    """The newest checkpoint of run ``key`` that any node holds, broadcast to every rank; None if there is none.

    A collective (one ``all_gather_object``, then a ``broadcast_object_list`` if some node has a checkpoint): only
    each node's local rank 0 reads its ``directory``; the holder of the newest (lowest rank on a tie) sends it.
    """
    ckpt = None
    if local_rank == 0:
        ckpt = load_latest_checkpoint(directory)
        if ckpt is not None and ckpt.get("key") != key:
            print(f"ignoring {directory}: its checkpoint belongs to run {ckpt.get('key')}", flush=True)
            ckpt = None
    epochs: list[Any] = [None] * world
    dist.all_gather_object(epochs, -1 if ckpt is None else int(ckpt["epoch"]))
    newest = max(range(world), key=lambda k: (epochs[k], -k))
    if epochs[newest] < 0:
        return None
    holder = [ckpt if rank == newest else None]
    dist.broadcast_object_list(holder, src=newest)
    return holder[0]
