"""The collectives the distributed exchanges are built from: where their tensors live, one all-to-all, and the
routing of requested ids to their owners.

The sampler (``dist_sampler``), the feature exchange (``dist_features``) and the sharded embeddings
(``sharded_embedding``) move variable-sized runs between ranks the same way: each rank first learns how many
entries every peer will send it (an all-to-all of counts, one per rank), then runs one ``all_to_all_single`` with
those split sizes. ``all_to_all`` is that second step; ``route_to_owners`` is both steps for a request of ids, as
the feature exchange and the embeddings make it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.phases import phase


def comm_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where tensors handed to this group's collectives must live: the current CUDA device for nccl, else CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# dtypes gloo's all_to_all refuses (torch 2.13: "Invalid scalar type"; float32, float16, bfloat16, int8, uint8 and
# bool pass), moved as their bytes; tests/test_feature_precision.py moves each on 2 gloo ranks. (Feature stores
# hold float8 as uint8 bits already, FeatureCodec.carrier: torch has no CPU index ops for it either.)
SENT_AS_BYTES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.int16, torch.uint16})


def all_to_all(send: Tensor, send_split: list[int], recv_split: list[int], group: dist.ProcessGroup | None,
               device: torch.device, wire_dtype: torch.dtype | None = None) -> Tensor:
    """``all_to_all_single`` along dim 0 with variable splits; the answer comes back on ``send``'s device.

    Rank q gets the ``send_split[q]`` rows of ``send`` that follow the first ``sum(send_split[:q])``; this rank
    receives ``sum(recv_split)`` rows, grouped by source rank. The collective runs on ``device`` (the group's
    ``comm_device``). Two uses:

    - ids and counts (``wire_dtype`` given): narrowed to ``wire_dtype`` for the wire and answered as int64. int32
      halves the bytes moved (on gloo, CPU time in the TCP transport) when every value fits below 2^31.
    - feature rows (``wire_dtype`` None): ``[n, F]``, sent and answered in their own dtype; a dtype gloo refuses
      ("Invalid scalar type": float8, int16) travels as its bytes (a free view, the same bytes on the wire).
    """
    with phase("exchange"):   # the time a training pass spends here (waiting on slower peers included)
        wire = send.to(device=device, dtype=send.dtype if wire_dtype is None else wire_dtype).contiguous()
        as_bytes = wire_dtype is None and wire.dtype in SENT_AS_BYTES and wire.dim() == 2
        if as_bytes:
            wire = wire.view(torch.uint8)
        recv = torch.empty((sum(recv_split), *wire.shape[1:]), dtype=wire.dtype, device=device)
        dist.all_to_all_single(recv, wire, recv_split, send_split, group=group)
        if as_bytes:
            recv = recv.view(send.dtype)
        return recv.to(device=send.device, dtype=send.dtype if wire_dtype is None else torch.long)


def all_reduce(t: Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
               group: dist.ProcessGroup | None = None) -> Tensor:
    """``t`` reduced over the group's ranks, on ``t``'s device. The collective itself runs on the group's device
    (``comm_device``): nccl refuses CPU tensors ("No backend type associated with device type cpu"), which is how
    two benchmarks crashed on the first GPU run, and gloo takes either. Every reduction goes through here."""
    with phase("exchange"):
        on = t.to(comm_device(group))
        dist.all_reduce(on, op=op, group=group)
        return on.to(t.device)


def all_reduce_f64(values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
                   group: dist.ProcessGroup | None = None) -> list[float]:
    """``values`` reduced over the group's ranks in one collective (float64: counts stay exact below 2^53)."""
    return all_reduce(torch.tensor(values, dtype=torch.float64), op, group).tolist()


def max_over_ranks(value: int, group: dist.ProcessGroup | None = None) -> int:
    """The largest ``value`` over the group's ranks (``value`` itself without a process group). Collective: loops of
    collectives run that many steps on every rank, the ranks with fewer steps joining with empty ones."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    return int(all_reduce(torch.tensor([value], dtype=torch.long), dist.ReduceOp.MAX, group).item())


@dataclass(frozen=True)
class Owners:
    """This rank's place among the owners of id ranges: rank q owns ``[bounds[q], bounds[q + 1])`` (``bounds`` on
    the holder's device); without an initialised process group, one rank owning everything."""

    distributed: bool
    rank: int
    world_size: int
    bounds: Tensor

    @classmethod
    def of(cls, bounds: np.ndarray | list[int], group: dist.ProcessGroup | None, device: torch.device) -> Owners:
        """Refuses ``bounds`` that split the ids into another number of ranges than the group has ranks."""
        distributed = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size(group) if distributed else 1
        tensor = torch.as_tensor(np.asarray(bounds, dtype=np.int64), device=device)
        if tensor.numel() != world + 1:
            raise ValueError(f"{tensor.numel() - 1} partitions for {world} ranks")
        return cls(distributed, dist.get_rank(group) if distributed else 0, world, tensor)

    @property
    def lo(self) -> int:
        """The first id this rank owns."""
        return int(self.bounds[self.rank])

    @property
    def hi(self) -> int:
        """One past the last id this rank owns."""
        return int(self.bounds[self.rank + 1])


@dataclass
class Requests:
    """One request of ids, routed: the ids this rank owns, and the others grouped by their owner rank."""

    local_pos: Tensor     # positions (in the requested ids) of this rank's own ids
    req_pos: Tensor       # positions of the other ids, grouped by owner
    req_split: list[int]  # how many of them each rank owns
    got_split: list[int]  # how many ids each rank asks of this one
    got_id: Tensor        # the ids the peers ask this rank for, grouped by requester


def route_to_owners(ids: Tensor, bounds: Tensor, rank: int, world: int, group: dist.ProcessGroup | None,
                    device: torch.device, wire_dtype: torch.dtype, what: tuple[str, str]) -> Requests:
    """Route ``ids`` (rank q owns ``[bounds[q], bounds[q + 1])``) to their owners: 2 collectives (counts as
    int64, ids as ``wire_dtype``) when ``world > 1``, none on one rank, where every id must be its own (else a
    ValueError naming ``what``: the ids and their holder, e.g. ``("gids", "store")``)."""
    owner = torch.searchsorted(bounds, ids, right=True) - 1
    is_local = owner == rank
    local_pos = torch.nonzero(is_local).squeeze(1)
    if world == 1:
        if local_pos.numel() != ids.numel():
            raise ValueError(f"{what[0]} outside [0, {int(bounds[-1])}) requested from a 1-rank {what[1]}")
        empty = ids.new_empty(0)
        return Requests(local_pos, empty, [0], [0], empty)
    remote_pos = torch.nonzero(~is_local).squeeze(1)
    remote_owner = owner.index_select(0, remote_pos)
    req_pos = remote_pos.index_select(0, torch.argsort(remote_owner, stable=True))   # grouped by owner
    req_split = torch.bincount(remote_owner, minlength=world).tolist()
    ones = [1] * world
    got_split = all_to_all(torch.tensor(req_split, dtype=torch.long), ones, ones, group, device).tolist()
    got_id = all_to_all(ids.index_select(0, req_pos), req_split, got_split, group, device, wire_dtype)
    return Requests(local_pos, req_pos, req_split, got_split, got_id)
