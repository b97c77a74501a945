"""Learnable embeddings of a featureless node type, sharded by owner: rank r holds and updates the rows it owns.

ID space: ``tgid``, the type's own global numbering (``stages.runtime.typed_rows.TypeIndex``): part p owns the
type's tgids ``[bounds[p], bounds[p + 1])`` and keeps them as rows ``tgid - bounds[p]`` of ``weight``.

A training step, in lockstep on every rank (collectives match by call order)::

    gather(tgid)   rows of any owner: own ones read from ``weight``, remote ones answered by their owners
                   (3 all_to_alls, as the feature exchange); the rows are a leaf that requires grad
    backward       fills the leaf's ``grad``
    step()         each gathered row's gradient goes back to its owner (1 all_to_all of counts is not needed: the
                   splits are the gather's, reversed), which adds up the gradients of its rows and steps a
                   ``SparseAdam`` on exactly those rows

so a rank updates only the rows its ranks' batches touched, and one row gathered by several ranks gets the sum of
their gradients, as a replicated ``nn.Embedding`` under DDP would (DDP averages; ``grad_scale`` says by what).
Every rank must call ``step`` after every training batch, padding batches included, and ``gather`` as often as
its peers. Outside DDP: the embeddings are not replicated, so DDP must not see them.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.collectives import Owners, Requests, all_to_all, comm_device, route_to_owners
from stages.runtime.seeds import STREAM_EMBEDDING, stream_seed

_INIT_CHUNK_ROWS = 1 << 16


def init_rows(lo: int, hi: int, dim: int, seed: int, node_type: int) -> Tensor:
    """Initial rows of tgids ``[lo, hi)``: N(0, 1) / sqrt(dim) drawn per 2^16-tgid chunk from a stream of its own
    (``STREAM_EMBEDDING``), so a row's initial value depends on (seed, type, tgid) only, not on which rank holds it
    (1 rank vs 2 ranks agree)."""
    out = torch.empty((hi - lo, dim), dtype=torch.float32)
    for chunk in range(lo // _INIT_CHUNK_ROWS, -(-hi // _INIT_CHUNK_ROWS)):
        c_lo, c_hi = chunk * _INIT_CHUNK_ROWS, (chunk + 1) * _INIT_CHUNK_ROWS
        gen = torch.Generator().manual_seed(stream_seed(seed, node_type, chunk, STREAM_EMBEDDING))
        rows = torch.randn((_INIT_CHUNK_ROWS, dim), generator=gen) / dim ** 0.5
        a, b = max(lo, c_lo), min(hi, c_hi)
        if a < b:
            out[a - lo:b - lo] = rows[a - c_lo:b - c_lo]
    return out


class ShardedEmbedding:
    """One featureless type's ``[num_tgids, dim]`` table split by ``bounds`` (tgid ranges per rank)."""

    def __init__(self, bounds: np.ndarray | list[int], dim: int, *, lr: float, seed: int, node_type: int = 0,
                 device: torch.device | str = "cpu", group: dist.ProcessGroup | None = None,
                 step_group: dist.ProcessGroup | None = None) -> None:
        """``group``: the gathers' process group; ``step_group``: the steps' (None: the default group). They differ
        when a prefetching thread gathers while the training thread steps (``stages.train.rank.prefetch``): one group
        per thread keeps each group's collectives in one order on every rank. Both span the same ranks."""
        self.group, self.step_group = group, step_group
        self.device = torch.device(device)
        owners = Owners.of(bounds, group, self.device)
        self.distributed, self.rank, self.world_size, self.bounds = (owners.distributed, owners.rank,
                                                                     owners.world_size, owners.bounds)
        self.lo = owners.lo
        self.weight = torch.nn.Parameter(init_rows(self.lo, owners.hi, dim, seed, node_type).to(self.device))
        self.optimizer = torch.optim.SparseAdam([self.weight], lr=lr)
        self.grad_scale = 1.0 / self.world_size   # DDP averages the dense gradients over ranks: the same here
        # each group its own exchange device: under prefetch on a GPU the gathers' group is gloo (host memory) while
        # the steps' default group is NCCL (device memory)
        self._comm_device = comm_device(group) if self.distributed else torch.device("cpu")
        self._step_comm_device = comm_device(step_group) if self.distributed else torch.device("cpu")
        self._wire_dtype = torch.int32 if int(self.bounds[-1]) < 2**31 else torch.long
        # since the last step: each gathered leaf, its own rows' lids, its routing
        self._pending: list[tuple[Tensor, Tensor, Requests]] = []

    @property
    def dim(self) -> int:
        return int(self.weight.shape[1])


    def gather(self, tgid: Tensor) -> Tensor:
        """``[len(tgid), dim]`` rows (any owner; may repeat). Under grad mode a leaf whose gradient ``step`` sends
        to the owners. A collective."""
        tgid = tgid.to(device=self.device, dtype=torch.long)
        route = route_to_owners(tgid, self.bounds, self.rank, self.world_size, self.group, self._comm_device,
                                self._wire_dtype, ("tgids", "embedding"))
        weight = self.weight.detach()
        out = torch.empty((tgid.numel(), self.dim), dtype=weight.dtype, device=self.device)
        local_row = tgid.index_select(0, route.local_pos) - self.lo
        out.index_copy_(0, route.local_pos, weight.index_select(0, local_row))
        if self.world_size > 1:
            answer = weight.index_select(0, route.got_id - self.lo)
            out.index_copy_(0, route.req_pos, all_to_all(answer, route.got_split, route.req_split, self.group,
                                                         self._comm_device))
        if torch.is_grad_enabled():
            out.requires_grad_(True)
            self._pending.append((out, local_row, route))
        return out

    def step(self) -> int:
        """Send the gradients of every row gathered since the last step to its owner and step the optimiser on
        the own rows they touched; returns how many. A collective (every rank, every training batch)."""
        rows, grads = [], []
        for out, local_row, route in self._pending:
            grad = out.grad if out.grad is not None else torch.zeros_like(out)
            rows.append(local_row)
            grads.append(grad.index_select(0, route.local_pos))
            if self.world_size > 1:
                rows.append(route.got_id - self.lo)
                grads.append(all_to_all(grad.index_select(0, route.req_pos), route.req_split, route.got_split,
                                        self.step_group, self._step_comm_device))
        self._pending.clear()
        if not rows:
            return 0
        grad_sparse = torch.sparse_coo_tensor(torch.cat(rows).unsqueeze(0), torch.cat(grads) * self.grad_scale,
                                              tuple(self.weight.shape), check_invariants=False).coalesce()
        touched = int(grad_sparse.indices().shape[1])
        if touched:
            self.weight.grad = grad_sparse
            self.optimizer.step()
        self.weight.grad = None
        return touched

    def discard(self) -> None:
        """Forget the rows gathered since the last step (an evaluation pass under grad mode; nothing to send)."""
        self._pending.clear()

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard and its optimiser state: copies (the optimiser updates both in place)."""
        return {"lo": self.lo, "weight": self.weight.detach().to("cpu", copy=True),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["lo"]) != self.lo or tuple(state["weight"].shape) != tuple(self.weight.shape):
            raise ValueError(f"embedding shard for tgids from {state['lo']} {tuple(state['weight'].shape)} does not "
                             f"fit this rank's [{self.lo}, +{self.weight.shape[0]})")
        with torch.no_grad():
            self.weight.copy_(state["weight"].to(self.device))
        self.optimizer.load_state_dict(state["optimizer"])
