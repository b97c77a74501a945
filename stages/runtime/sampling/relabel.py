"""gid -> batch-local position maps for the multi-hop samplers (node dedup across hops, first-occurrence order).

A batch's ``n_id`` lists the seeds first, then every newly reached gid in the order it was first sampled. Each hop
hands the map the sampled neighbour gids (candidates, with repeats) and gets back each candidate's position in
``n_id`` plus the gids that were new, in first-occurrence order. Two implementations, same results:

- ``DenseNodeMap``: an int32 table over all N gids (4 bytes a node). O(candidates) gathers/scatters, no sort;
  only the entries a batch touched are reset, so the table costs nothing per batch beyond the batch itself.
- ``SortedNodeMap``: sorted known gids + ``searchsorted``; memory O(batch), for graphs too big for the table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from stages.runtime.segments import steps_of

SENTINEL = torch.iinfo(torch.int32).max  # "not in this batch"; also the identity of the amin below
_DENSE_TABLE_MAX_BYTES = 1 << 30


def unique_first_occurrence(gid: Tensor) -> tuple[Tensor, Tensor]:
    """Unique values of ``gid`` in order of first occurrence, and ``inverse`` with ``uniq[inverse] == gid``.

    ``torch.unique`` only returns sorted values; a stable sort puts each value's earliest index at the head of its
    group, and ordering the groups by that head index restores discovery order.
    """
    if gid.numel() == 0:
        return gid.clone(), torch.empty(0, dtype=torch.long, device=gid.device)
    sorted_gid, perm = torch.sort(gid, stable=True)
    is_head = torch.ones_like(sorted_gid, dtype=torch.bool)
    is_head[1:] = sorted_gid[1:] != sorted_gid[:-1]
    group = torch.cumsum(is_head, 0) - 1                  # group of each sorted element
    head_idx = perm[is_head]                              # earliest index of each value (stable sort)
    order = torch.argsort(head_idx)                       # groups in first-occurrence order
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=gid.device)
    inverse = torch.empty_like(perm)
    inverse[perm] = rank[group]
    return sorted_gid[is_head][order], inverse


class NodeMap(ABC):
    """Positions of the gids seen so far in the current batch; ``start`` begins a batch."""

    num_known: int = 0

    @abstractmethod
    def start(self, seed_gid: Tensor, *, checked: bool = False) -> None:
        """Begin a batch whose ``n_id`` starts with ``seed_gid`` (unique gids), forgetting the previous batch;
        ``checked``: the caller vouches that they are unique (else it is checked: a host read on a GPU)."""

    @abstractmethod
    def add(self, cand_gid: Tensor) -> tuple[Tensor, Tensor]:
        """Returns ``(cand_pos, new_gid)``: each candidate's position (int32 or int64) and the new gids in
        first-occurrence order."""


class DenseNodeMap(NodeMap):
    """The table holds each gid's batch position (``SENTINEL``: not in this batch). Candidates must be gids below
    ``num_nodes`` (the CSR's sources are)."""

    def __init__(self, num_nodes: int, device: torch.device | str = "cpu") -> None:
        self.num_nodes = num_nodes
        self.table = torch.full((num_nodes,), SENTINEL, dtype=torch.int32, device=device)
        self._touched_gid: list[Tensor] = []

    def start(self, seed_gid: Tensor, *, checked: bool = False) -> None:
        if self._touched_gid:                             # reset only what the previous batch wrote
            self.table.index_fill_(0, torch.cat(self._touched_gid), SENTINEL)
        self._touched_gid = [seed_gid]
        num_seeds = seed_gid.numel()
        seed_pos = steps_of(0, num_seeds, seed_gid.device, torch.int32)
        self.table.scatter_(0, seed_gid, seed_pos)
        # with a repeated seed, one of its writes is overwritten: that is how a duplicate shows up here
        if num_seeds and not checked and bool((self.table.index_select(0, seed_gid) != seed_pos).any()):
            raise ValueError("seed gids of a batch must be unique; deduplicate the train split")
        self.num_known = num_seeds

    def add(self, cand_gid: Tensor) -> tuple[Tensor, Tensor]:
        """Over all the candidates, with one host synchronisation (the count of new gids): on a GPU, compacting
        the unknown candidates first cost a second one (``nonzero``) a hop."""
        # index_select / scatter_ rather than ``t[idx]`` / ``t[idx] = v``: 4-10x faster on CPU for 1-D tensors
        table = self.table
        is_new = table.index_select(0, cand_gid) == SENTINEL
        cand_idx = steps_of(0, cand_gid.numel(), cand_gid.device, torch.int32)
        # amin of the candidate index per unknown gid picks its first occurrence deterministically (a plain
        # scatter with repeated indices leaves an unspecified writer, and CUDA/OpenMP do not agree on one); a
        # known candidate offers SENTINEL, the amin's identity, so its entry keeps its position. Each candidate
        # writes to its own gid's entry, so a GPU's atomics spread as the gids do (sending all the known ones to
        # one spare entry once queued a hop's ~300 k on one address), in 1 op where spreading them took 3
        table.scatter_reduce_(0, cand_gid, torch.where(is_new, cand_idx, SENTINEL), reduce="amin")
        is_first = is_new & (table.index_select(0, cand_gid) == cand_idx)
        new_gid = cand_gid.masked_select(is_first)        # ascending candidate index = discovery order
        num_new = new_gid.numel()
        table.scatter_(0, new_gid, steps_of(self.num_known, self.num_known + num_new, cand_gid.device, torch.int32))
        cand_pos = table.index_select(0, cand_gid)   # the new gids' positions now, the known ones' as they were
        self.num_known += num_new
        self._touched_gid.append(new_gid)
        return cand_pos, new_gid          # int32: the caller widens it while writing edge_index


class SortedNodeMap(NodeMap):
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._known_gid = torch.empty(0, dtype=torch.long, device=device)   # sorted
        self._known_pos = torch.empty(0, dtype=torch.long, device=device)

    def start(self, seed_gid: Tensor, *, checked: bool = False) -> None:
        self._known_gid, self._known_pos = torch.sort(seed_gid)
        if not checked and self._known_gid.numel() > 1 and bool((self._known_gid[1:] == self._known_gid[:-1]).any()):
            raise ValueError("seed gids of a batch must be unique; deduplicate the train split")
        self.num_known = seed_gid.numel()

    def add(self, cand_gid: Tensor) -> tuple[Tensor, Tensor]:
        if self._known_gid.numel() == 0:
            hit = torch.zeros_like(cand_gid, dtype=torch.bool)
            cand_pos = torch.full_like(cand_gid, -1)
        else:
            slot = torch.searchsorted(self._known_gid, cand_gid).clamp_(max=self._known_gid.numel() - 1)
            hit = self._known_gid[slot] == cand_gid
            cand_pos = torch.where(hit, self._known_pos[slot], -1)
        miss = ~hit
        new_gid, inverse = unique_first_occurrence(cand_gid[miss])
        cand_pos[miss] = inverse + self.num_known
        new_pos = torch.arange(self.num_known, self.num_known + new_gid.numel(), device=cand_gid.device)
        self._known_gid, order = torch.sort(torch.cat([self._known_gid, new_gid]))
        self._known_pos = torch.cat([self._known_pos, new_pos])[order]
        self.num_known += new_gid.numel()
        return cand_pos, new_gid


def make_node_map(num_nodes: int, device: torch.device | str = "cpu", kind: str = "auto") -> NodeMap:
    """``kind``: ``dense``, ``sorted`` or ``auto`` (dense while its table stays under 1 GiB)."""
    if kind == "auto":
        kind = "dense" if num_nodes * 4 <= _DENSE_TABLE_MAX_BYTES else "sorted"
    if kind == "dense":
        return DenseNodeMap(num_nodes, device)
    if kind == "sorted":
        return SortedNodeMap(device)
    raise ValueError(f"unknown node map kind {kind!r}; use 'auto', 'dense' or 'sorted'")
