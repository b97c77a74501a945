"""A training run's checkpoints: atomic save, list and load, and the ranks' agreement on which one to resume.

Files: one per checkpoint in the job directory (names and place: ``storage.train``), each written to a temporary
name and ``os.replace``d into place, so a killed writer never leaves a truncated checkpoint under a valid name; the
``KEEP_CHECKPOINTS`` newest are kept. Contents (``torch.save`` of a dict)::

    {"key": train artifact key, "epoch": last completed epoch (0-based), "model": state_dict,
     "optimizer": state_dict, "scheduler": the LR scheduler's state_dict or None,
     "best": {"epoch", "val", "state": the best-validation weights (CPU)} (stages.train.rank.recipe.BestModel),
     "ranks": [per global rank: {"rng": its RNG states}], "history": [per-epoch metrics]}

and on a typed graph one part per rank beside it (``ckpt-<epoch>.rank-<r>.pt``: ``{"embeddings": its embedding
shards and their SparseAdam state, "best_embeddings": its shards of the best epoch}``), written by the rank itself
before any node writes the checkpoint that names the epoch complete. Gathering them into the one file instead cost
every rank all ranks' shards at every epoch: 1.2 GB per checkpoint at ogbn-mag scale (1.13 M authors x 64,
weights, two Adam moments and the best epoch's copy), pickled through the process group.

Each node's local rank 0 writes to its own directory (no shared file system needed), and torchrun may hand a node
other global ranks on the next attempt (c10d orders nodes by address): ``resume_state`` makes the ranks agree on
the newest checkpoint any node holds and broadcasts it; ``resume_part`` finds each rank's part on a node that
holds it (its own directory, unless the ranks moved between nodes). On several nodes each part is also written on
the next node (``save_replicated_part``), so that any one node's directory can be lost, as with the main file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stages.runtime.collectives import comm_device
from storage.train import atomic_write_bytes, checkpoint_path, list_checkpoints, list_shards, shard_path, torch_bytes

KEEP_CHECKPOINTS = 2


def save_checkpoint(directory: str | os.PathLike[str], epoch: int, state: dict[str, Any],
                    keep: int = KEEP_CHECKPOINTS) -> Path:
    """Write ``state`` as the checkpoint after ``epoch`` (0-based, completed) and drop all but the ``keep`` newest."""
    path = checkpoint_path(directory, epoch)
    atomic_write_bytes(path, torch_bytes(state))
    listed = list_checkpoints(directory)
    for _, old in listed[:-keep]:
        old.unlink(missing_ok=True)
    oldest_kept = listed[-keep:][0][0]
    for part_epoch, _, part in list_shards(directory):   # parts of dropped checkpoints (or of none: a killed run's)
        if part_epoch < oldest_kept:
            part.unlink(missing_ok=True)
    return path


def save_part(directory: str | os.PathLike[str], epoch: int, rank: int, part: dict[str, Any]) -> None:
    """Rank ``rank``'s part of the checkpoint after ``epoch`` (see the module docstring)."""
    atomic_write_bytes(shard_path(directory, epoch, rank), torch_bytes(part))


def save_replicated_part(directory: str | os.PathLike[str], epoch: int, part: dict[str, Any], *, rank: int,
                         world: int, local_world: int) -> None:
    """``save_part``, and on several nodes also the part of the rank ``local_world`` behind (the same local rank on
    the previous node), sent over the process group: every part then lives on two nodes, so losing one node's
    directory loses no rank's learnt embeddings (the single-node case sends nothing). A collective when
    ``world > local_world``."""
    data = torch_bytes(part)
    atomic_write_bytes(shard_path(directory, epoch, rank), data)
    if world <= local_world:
        return
    device = comm_device()
    send_to, recv_from = (rank + local_world) % world, (rank - local_world) % world
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.long, device=device)
    got_size = torch.empty(1, dtype=torch.long, device=device)
    _exchange(size, send_to, got_size, recv_from)
    got = torch.empty(int(got_size), dtype=torch.uint8, device=device)
    _exchange(payload, send_to, got, recv_from)
    atomic_write_bytes(shard_path(directory, epoch, recv_from), got.cpu().numpy().tobytes())


def _exchange(send: torch.Tensor, to: int, recv: torch.Tensor, source: int) -> None:
    """Send ``send`` to rank ``to`` while receiving ``recv`` from rank ``source``, posted as one group: on NCCL a
    send and a receive issued apart can each wait for the other (2 nodes: ``to == source``; NVIDIA/nccl#479)."""
    ops = [dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, source)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def resume_part(directory: str | os.PathLike[str], epoch: int, *, rank: int, world: int) -> dict[str, Any]:
    """This rank's part of the checkpoint after ``epoch``, from its node's directory or, when the ranks moved
    between nodes, from a node that holds it. A collective (one ``all_gather_object`` of which parts each rank's
    directory holds; one ``broadcast_object_list`` per part that its rank's node lacks)."""
    here = {r for e, r, _ in list_shards(directory) if e == epoch}
    mine = None
    if rank in here:
        try:
            mine = torch.load(shard_path(directory, epoch, rank), map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - unreadable (a disk error): another node's copy, or one error everywhere
            here.discard(rank)
    held: list[Any] = [None] * world
    dist.all_gather_object(held, sorted(here))
    for r in range(world):
        if r in held[r]:
            continue
        holder = next((q for q in range(world) if r in held[q]), None)
        if holder is None:
            raise RuntimeError(f"the checkpoint after epoch {epoch + 1} lacks rank {r}'s part on every node: was a "
                               f"node's checkpoint directory lost? delete {directory} to start over")
        box = [torch.load(shard_path(directory, epoch, r), map_location="cpu", weights_only=False)
               if rank == holder else None]
        dist.broadcast_object_list(box, src=holder)
        if rank == r:
            mine = box[0]
    assert mine is not None
    return mine


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
