"""The collectives both distributed exchanges are built from: where their tensors live, and one all-to-all.

The sampler (``dist_sampler``) and the feature exchange (``dist_features``) move variable-sized runs between
ranks the same way: each rank first learns how many entries every peer will send it (an all-to-all of counts,
one per rank), then runs one ``all_to_all_single`` with those split sizes. ``all_to_all`` is that second step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def comm_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where tensors handed to this group's collectives must live: the current CUDA device for nccl, else CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_to_all(send: Tensor, send_split: list[int], recv_split: list[int], group: dist.ProcessGroup | None,
               device: torch.device, wire_dtype: torch.dtype | None = None) -> Tensor:
    """``all_to_all_single`` along dim 0 with variable splits; the answer comes back on ``send``'s device.

    Rank q gets the ``send_split[q]`` rows of ``send`` that follow the first ``sum(send_split[:q])``; this rank
    receives ``sum(recv_split)`` rows, grouped by source rank. The collective runs on ``device`` (the group's
    ``comm_device``). Two uses:

    - ids and counts (``wire_dtype`` given): narrowed to ``wire_dtype`` for the wire and answered as int64. int32
      halves the bytes moved (on gloo, CPU time in the TCP transport) when every value fits below 2^31.
    - feature rows (``wire_dtype`` None): ``[n, F]``, sent and answered in their own dtype.
    """
    wire = send.to(device=device, dtype=send.dtype if wire_dtype is None else wire_dtype).contiguous()
    recv = torch.empty((sum(recv_split), *send.shape[1:]), dtype=wire.dtype, device=device)
    dist.all_to_all_single(recv, wire, recv_split, send_split, group=group)
    return recv.to(device=send.device, dtype=send.dtype if wire_dtype is None else torch.long)


def max_over_ranks(value: int, group: dist.ProcessGroup | None = None) -> int:
    """The largest ``value`` over the group's ranks (``value`` itself without a process group). Collective: loops of
    collectives run that many steps on every rank, the ranks with fewer steps joining with empty ones."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    total = torch.tensor([value], dtype=torch.long, device=comm_device(group))
    dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
    return int(total.item())
