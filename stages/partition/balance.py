"""Balance repair after METIS: bring nodes, train nodes and edges per part within a tolerance, losing little cut.

Why this exists: pymetis 2025.2.2 silently ignores multi-constraint vertex weights (a second "is train" constraint
left a 2-part split at 5014 / 9 train nodes, the same partition whatever the weights), so METIS balances one
combined weight only and train nodes end up wherever their communities are. The repair moves nodes between parts
in a few rounds, always the ones with the best cut gain, in phases that each keep what the earlier ones fixed:

1. nodes: non-train nodes of over-full parts move to under-full parts (train counts unchanged);
2. train nodes: train nodes of parts with too many move to parts with too few, and as many non-train nodes move
   back (node counts unchanged);
3. edges (``edge_weight`` given): heavy non-train nodes of edge-heavy parts swap with light ones (node and train
   counts unchanged);
4. refinement: nodes with a positive gain move to their best part while every constraint stays within the
   tolerance, which wins back part of the cut the phases above cost.

gain(v -> q) = (#neighbours of v in q) - (#neighbours of v in its own part): the cut reduction, in edges, if v alone
moved. ``conn[v, q]`` (neighbours of v per part) is computed once over the whole symmetric adjacency and then
updated incrementally from the moved nodes' neighbour lists; moving in rounds lets later moves see earlier ones.

On a 4-community graph with the train nodes in one community this matched real multi-constraint METIS (called
through ctypes for the comparison): cut 0.186 vs 0.183 (2 parts), 0.35 vs 0.345 (4 parts), with every imbalance
<= 1.03 where METIS left 1.04-1.05.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from stages.partition.csr_ops import chunk_rows, gather_rows, row_chunks

DEFAULT_TOLERANCE = 1.03
ROUNDS = 4


def neighbour_part_counts(xadj: np.ndarray, adjncy: np.ndarray, part: np.ndarray, num_parts: int) -> np.ndarray:
    """``conn[v, q]`` = number of neighbours of v in part q (int32 [N, P]), chunked over the CSR."""
    num_nodes = int(xadj.shape[0] - 1)
    conn = np.zeros((num_nodes, num_parts), dtype=np.int32)
    for r0, r1 in row_chunks(xadj):
        key = (chunk_rows(xadj, r0, r1) - r0) * num_parts + part[adjncy[xadj[r0]:xadj[r1]]]
        conn[r0:r1] = np.bincount(key, minlength=(r1 - r0) * num_parts).reshape(r1 - r0, num_parts)
    return conn


class _Mover:
    """The current assignment plus ``conn``, kept consistent as nodes move."""

    def __init__(self, xadj: np.ndarray, adjncy: np.ndarray, part: np.ndarray, num_parts: int) -> None:
        self.xadj, self.adjncy, self.num_parts = xadj, adjncy, num_parts
        self.part = part
        self.conn = neighbour_part_counts(xadj, adjncy, part, num_parts)
        self.moved = 0

    def gain(self, nodes: np.ndarray, to_part: int) -> np.ndarray:
        own = self.conn[nodes, self.part[nodes]].astype(np.int64)
        return self.conn[nodes, to_part].astype(np.int64) - own

    def best(self, candidates: np.ndarray, to_part: int, k: int) -> np.ndarray:
        """The k candidates with the highest gain towards ``to_part``; ties go to the lower id (deterministic)."""
        if k >= candidates.shape[0]:
            return candidates
        order = np.argsort(-self.gain(candidates, to_part), kind="stable")
        return candidates[order[:k]]

    def move(self, nodes: np.ndarray, to_part: int) -> None:
        if nodes.shape[0] == 0:
            return
        from_part = self.part[nodes]
        sub_indptr, nbrs = gather_rows(self.xadj, self.adjncy, nodes)
        # int64 before ``* num_parts``: a memory-mapped adjacency is int32 (the streamed path), and int32 times a
        # Python int stays int32 in NumPy 2, which wraps once N * P reaches 2^31 (300 M nodes into 8 parts)
        nbrs = nbrs.astype(np.int64, copy=False)
        deg = np.diff(sub_indptr)
        flat = self.conn.reshape(-1)
        # Each neighbour u of a moved node v loses one neighbour in v's old part and gains one in the new part.
        np.subtract.at(flat, nbrs * self.num_parts + np.repeat(from_part, deg), 1)
        np.add.at(flat, nbrs * self.num_parts + to_part, 1)
        self.part[nodes] = to_part
        self.moved += int(nodes.shape[0])


def imbalance(counts: np.ndarray) -> float:
    """max / mean (1.0 = perfect; 1.0 for an all-zero constraint)."""
    mean = float(counts.mean()) if counts.size else 0.0
    return float(counts.max()) / mean if mean > 0 else 1.0


def _balanced_enough(counts: np.ndarray, tolerance: float) -> bool:
    # Integer counts cannot beat ceil(mean): 1 train node in 2 parts is as balanced as it gets.
    mean = float(counts.mean())
    return float(counts.max()) <= max(math.ceil(mean), mean * tolerance)


def _flows(counts: np.ndarray, tolerance: float, rounds_left: int) -> list[tuple[int, int, int]]:
    """(from part, to part, how many) for this round: over-full parts down to half the tolerance, under-full
    parts up to the mean at most, spread over the remaining rounds."""
    mean = float(counts.mean())
    high = max(math.ceil(mean), math.floor(mean * (1.0 + (tolerance - 1.0) / 2)))
    excess = np.maximum(0, counts - high)
    excess = -(-excess // rounds_left)  # ceil division: the last round moves all that is left
    deficit = np.maximum(0, math.ceil(mean) - counts)
    flows = []
    for p in np.argsort(-excess, kind="stable"):
        for q in np.argsort(-deficit, kind="stable"):
            k = int(min(excess[p], deficit[q]))
            if k <= 0:
                continue
            flows.append((int(p), int(q), k))
            excess[p] -= k
            deficit[q] -= k
    return flows


def rebalance(xadj: np.ndarray, adjncy: np.ndarray, part: np.ndarray, train_mask: np.ndarray, num_parts: int, *,
              balance_train: bool = True, edge_weight: np.ndarray | None = None, node_type: np.ndarray | None = None,
              tolerance: float = DEFAULT_TOLERANCE, rounds: int = ROUNDS) -> tuple[np.ndarray, dict[str, int]]:
    """Repair node, train-node (if ``balance_train``) and edge (if ``edge_weight``) balance of ``part`` in place,
    then refine the cut (module docstring); returns ``(part, stats)`` with the number of nodes moved per phase.

    ``xadj``/``adjncy`` must be the whole symmetric adjacency (gains are measured on it). ``edge_weight``: the
    edges each node brings to its part (its in-degree). ``node_type`` (typed graphs): the nodes and train nodes
    are balanced per type, and every move or swap stays within a type, so a part's counts of each type are
    constraints of their own (one type: the untyped repair). Phases aim at half the tolerance, refinement may use
    all.
    """
    mover = _Mover(xadj, adjncy, part, num_parts)
    groups = type_groups(node_type, part.shape[0])
    stats = {"moved_for_nodes": 0, "moved_for_train": 0}
    for in_type in groups:
        movable = in_type & ~train_mask if balance_train else in_type
        _balance_nodes(mover, in_type, movable, tolerance, rounds)
    stats["moved_for_nodes"] = mover.moved

    if balance_train:
        for in_type in groups:
            _balance_train(mover, train_mask & in_type, ~train_mask & in_type, tolerance, rounds)
        stats["moved_for_train"] = mover.moved - stats["moved_for_nodes"]

    if edge_weight is not None:
        before = mover.moved
        _balance_edges(mover, edge_weight, ~train_mask if balance_train else np.ones_like(train_mask), groups,
                       tolerance, rounds)
        stats["moved_for_edges"] = mover.moved - before

    before = mover.moved
    _refine(mover, groups, train_mask if balance_train else None, edge_weight, tolerance, rounds)
    stats["moved_for_cut"] = mover.moved - before
    return mover.part, stats


def type_groups(node_type: np.ndarray | None, num_nodes: int) -> list[np.ndarray]:
    """One boolean mask per node type (one all-true mask without types)."""
    if node_type is None:
        return [np.ones(num_nodes, dtype=bool)]
    return [node_type == t for t in range(int(node_type.max()) + 1 if node_type.size else 0)]


def _flow_rounds(mover: _Mover, members: np.ndarray, tolerance: float, rounds: int
                 ) -> Iterator[tuple[int, int, int]]:
    """The (from part, to part, how many) flows of each round, counted again before each round, until the
    ``members``' counts per part are balanced enough."""
    for r in range(rounds):
        counts = np.bincount(mover.part[members], minlength=mover.num_parts)
        if _balanced_enough(counts, tolerance):
            return
        yield from _flows(counts, tolerance, rounds - r)


def _balance_nodes(mover: _Mover, members: np.ndarray, movable: np.ndarray, tolerance: float, rounds: int) -> None:
    """Phase 1 for one type: movable nodes of over-full parts go to under-full parts."""
    for p, q, k in _flow_rounds(mover, members, tolerance, rounds):
        candidates = np.flatnonzero((mover.part == p) & movable)
        mover.move(mover.best(candidates, q, k), q)


def _balance_train(mover: _Mover, train: np.ndarray, others: np.ndarray, tolerance: float, rounds: int) -> None:
    """Phase 2 for one type: train nodes of parts with too many move to parts with too few, as many of the type's
    other nodes move back (node counts unchanged)."""
    num_train = int(np.count_nonzero(train))
    if not 0 < num_train < num_train + int(np.count_nonzero(others)):
        return
    for p, q, k in _flow_rounds(mover, train, tolerance, rounds):
        out_nodes = np.flatnonzero((mover.part == p) & train)
        back_nodes = np.flatnonzero((mover.part == q) & others)
        k = min(k, out_nodes.shape[0], back_nodes.shape[0])
        mover.move(mover.best(out_nodes, q, k), q)
        # Chosen after the train nodes moved, so the gains see them (a node whose neighbours just came stays).
        mover.move(mover.best(back_nodes, p, k), p)


def _refine(mover: _Mover, groups: list[np.ndarray], train_mask: np.ndarray | None, edge_weight: np.ndarray | None,
            tolerance: float, rounds: int) -> None:
    """Win back cut: move nodes with a positive gain to their best part while every constraint of the receiving
    part stays within ``tolerance``. Movers of one (from, to) group only help each other (an edge between two of
    them stays uncut), so each group's real gain is at least the sum of its gains and the cut never grows."""
    num_parts = mover.num_parts
    columns = [in_type.astype(np.int64) for in_type in groups]   # nodes of each type
    if train_mask is not None:
        columns.append(train_mask.astype(np.int64))
    if edge_weight is not None:
        columns.append(edge_weight.astype(np.int64, copy=False))
    weights = np.stack(columns, axis=1)  # [N, C]
    mean = weights.sum(axis=0) / num_parts
    caps = np.maximum(np.ceil(mean), np.floor(mean * tolerance)).astype(np.int64)
    for _ in range(rounds):
        loads = np.stack([np.bincount(mover.part, weights=weights[:, c], minlength=num_parts)
                          for c in range(weights.shape[1])], axis=1).astype(np.int64)  # [P, C]
        own = mover.conn[np.arange(mover.part.shape[0]), mover.part]
        others = mover.conn.copy()
        others[np.arange(mover.part.shape[0]), mover.part] = -1
        best_part = others.argmax(axis=1)
        del others
        candidates = np.flatnonzero(mover.conn[np.arange(mover.part.shape[0]), best_part] > own)
        if candidates.shape[0] == 0:
            break
        moved_before = mover.moved
        group_key = mover.part[candidates] * num_parts + best_part[candidates]
        for key in np.unique(group_key):
            p, q = divmod(int(key), num_parts)
            group = candidates[group_key == key]
            gain = mover.gain(group, q)  # again: earlier groups of this round may have changed it
            keep = gain > 0
            group, gain = group[keep], gain[keep]
            group = group[np.argsort(-gain, kind="stable")]
            # the longest best-first prefix that fits in q under every constraint
            room = caps - loads[q]
            fits = np.all(np.cumsum(weights[group], axis=0) <= room, axis=1)
            k = int(np.argmin(fits)) if not fits.all() else group.shape[0]
            chosen = group[:k]
            mover.move(chosen, q)
            moved_weight = weights[chosen].sum(axis=0)
            loads[q] += moved_weight
            loads[p] -= moved_weight
        if mover.moved == moved_before:
            break


def _balance_edges(mover: _Mover, edge_weight: np.ndarray, movable: np.ndarray, groups: list[np.ndarray],
                   tolerance: float, rounds: int) -> None:
    """Swap heavy movable nodes of edge-heavy parts for light ones of edge-light parts, one for one and within a
    type, so node and train counts stay. Heavy/light = above/below the type's mean weight, so every swap moves a
    positive amount; heavy candidates are capped at mean + what still has to move, so a hub cannot overshoot."""
    means = [float(edge_weight[in_type].mean()) if in_type.any() else 0.0 for in_type in groups]
    for r in range(rounds):
        counts = np.bincount(mover.part, weights=edge_weight, minlength=mover.num_parts).astype(np.int64)
        if _balanced_enough(counts, tolerance):
            break
        for p, q, amount in _flows(counts, tolerance, rounds - r):
            for in_type, mean_w in zip(groups, means):
                if amount <= 0:
                    break
                amount -= _swap(mover, edge_weight, movable & in_type, mean_w, p, q, amount)


def _swap(mover: _Mover, edge_weight: np.ndarray, movable: np.ndarray, mean_w: float, p: int, q: int,
          amount: int) -> int:
    """Swap heavy movable nodes of p with light ones of q, best gains first, until ``amount`` edge weight moved;
    returns the weight moved."""
    heavy = np.flatnonzero((mover.part == p) & movable & (edge_weight > mean_w) & (edge_weight <= mean_w + amount))
    light = np.flatnonzero((mover.part == q) & movable & (edge_weight < mean_w))
    k = min(heavy.shape[0], light.shape[0])
    if k == 0:
        return 0
    heavy, light = mover.best(heavy, q, k), mover.best(light, p, k)
    # the first swaps (best gains) that together move `amount`
    moved = np.cumsum(edge_weight[heavy] - edge_weight[light])
    k = min(k, int(np.searchsorted(moved, amount)) + 1)
    mover.move(heavy[:k], q)
    mover.move(light[:k], p)
    return int(moved[k - 1])
