"""Multi-hop neighbour sampling as PyG batches, and the epoch's seed batches.

``MultiHopSampler`` runs the hop loop that the single-partition ``NeighborSampler`` and the distributed sampler
(``dist_sampler``) share: each hop's edges come from a subclass (``_sample_hop``; one hop's draws over a CSR are
``uniform``'s), the batch-local positions from the node map (``relabel``), and the batch is a PyG ``Data`` in
first-occurrence order. ``iter_seed_batches`` cuts an epoch's shuffled seeds into batches.

ID spaces: ``gid`` global; ``lid = gid - csr.start_gid`` local to the CSR's partition; ``*_pos`` positions in a
batch's ``n_id`` (``row_pos``: in the hop's frontier); ``egid`` an edge's global id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.fanouts import Fanout, validate_hop_fanouts
from stages.runtime.sampling.relabel import NodeMap, make_node_map
from stages.runtime.sampling.uniform import sample_typed_edges

__all__ = ["HopEdges", "MultiHopSampler", "NeighborSampler", "check_seed_range", "iter_seed_batches",
           "sample_own_hop", "shuffled"]


@dataclass
class HopEdges:
    """One hop's sampled edges: ``nbr_gid[i] -> frontier[row_pos[i]]``, with their edge types (``None``: one edge
    type), egids and feature rows (``None`` unless the sampler's ``with_edges`` and ``edge_attr``). ``by_target``:
    the edges come grouped by target in frontier order (then by edge type), by construction."""

    row_pos: Tensor
    nbr_gid: Tensor
    edge_type: Tensor | None = None
    egid: Tensor | None = None
    edge_attr: Tensor | None = None
    by_target: bool = False


class MultiHopSampler(ABC):
    """Hop loop shared by the single and distributed samplers; subclasses say how one hop is sampled.

    ``with_edges``: batches also carry ``e_id`` (the sampled edges' egids, aligned with ``edge_index``), and with
    ``edge_attr`` (float [e_p, D]: the features of the CSR's own edges, by elid) their features as ``edge_attr``;
    off by default, and then no edge id or row is computed or exchanged."""

    with_edges: bool = False
    edge_attr: Tensor | None = None

    def __init__(self, num_nodes: int, fanouts: Iterable[Fanout], device: torch.device, *, replace: bool,
                 generator: torch.Generator | None, node_map: str) -> None:
        self.fanouts = validate_hop_fanouts(fanouts)   # per hop: a count, or one per edge type (hop_fanouts)
        self.num_nodes = int(num_nodes)
        self.device = torch.device(device)
        self.replace = bool(replace)
        self.generator = generator
        self._node_map: NodeMap = make_node_map(self.num_nodes, self.device, node_map)

    @abstractmethod
    def _sample_hop(self, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
        """The frontier's sampled edges, ``row_pos`` indexing ``frontier_gid``; ``edge_type`` is ``None`` on a graph
        of one edge type, ``egid`` unless ``with_edges``."""

    def sample(self, seed_gid: Tensor, *, checked: bool = False) -> Data:
        """Multi-hop sample around ``seed_gid`` (unique gids; may be empty) as a PyG ``Data`` batch. ``checked``:
        the caller vouches that the seeds are unique and in range (a loader whose items were checked once,
        ``stages.train.rank.loader``), which saves the batch's two host reads that check them on a GPU.

        Fields: ``n_id`` (gids: seeds first, then new nodes in discovery order), ``edge_index`` [2, E] in
        batch-local positions (row 0 = source/neighbour, row 1 = target), ``batch_size``, ``num_sampled_nodes``
        ([batch_size, new nodes of hop 1, ...]) and ``num_sampled_edges`` (per hop), ``num_nodes``; on a graph
        of several edge types also ``edge_type`` [E] (int64, the schema's edge type ids), as PyG's
        ``to_homogeneous`` lays a typed graph out (``stages.runtime.typed_batch`` makes a ``HeteroData`` of it);
        with ``with_edges`` also ``e_id`` [E] (int64 egids, aligned with ``edge_index``) and, when the sampler holds
        ``edge_attr``, ``edge_attr`` [E, D] (the sampled edges' rows). ``edges_by_target`` (bool): every hop's
        edges came grouped by target (the hops of one CSR), so ``edge_index[1]`` (then ``edge_type``) is
        non-decreasing and the blocks need not check it, a host synchronisation on a GPU (``models.blocks``).
        """
        seed_gid = seed_gid.to(device=self.device, dtype=torch.long).view(-1)
        if seed_gid.numel() and not checked:
            check_seed_range(seed_gid, self.num_nodes)
        nodes = self._node_map
        nodes.start(seed_gid, checked=checked)
        batch_size = seed_gid.numel()
        n_id_parts, hop_edges, hop_types, hop_egids, hop_attrs = [seed_gid], [], [], [], []
        num_sampled_nodes, num_sampled_edges = [batch_size], []
        frontier_gid, frontier_start_pos = seed_gid, 0
        by_target = True
        # every hop runs even when the frontier is empty: the distributed subclass must stay in lockstep
        for fanout in self.fanouts:
            hop = self._sample_hop(frontier_gid, fanout)
            row_pos, nbr_gid = hop.row_pos, hop.nbr_gid
            by_target = by_target and hop.by_target
            nbr_pos, new_gid = nodes.add(nbr_gid)
            if hop.edge_type is not None:
                hop_types.append(hop.edge_type)
            if hop.egid is not None:
                hop_egids.append(hop.egid)
            if hop.edge_attr is not None:
                hop_attrs.append(hop.edge_attr)
            hop_edges.append((nbr_pos, row_pos, frontier_start_pos))   # the frontier is a contiguous run of n_id
            n_id_parts.append(new_gid)
            num_sampled_edges.append(int(nbr_gid.numel()))
            num_sampled_nodes.append(int(new_gid.numel()))
            frontier_start_pos += frontier_gid.numel()
            frontier_gid = new_gid
        n_id = torch.cat(n_id_parts)
        # one write per element into the final tensor (widening int32 positions and offsetting targets on the
        # way): cat + stack would copy every edge twice more, which shows on a memory-bound batch
        edge_index = torch.empty((2, sum(num_sampled_edges)), dtype=torch.long, device=self.device)
        lo = 0
        for nbr_pos, row_pos, frontier_start_pos in hop_edges:
            hi = lo + nbr_pos.numel()
            edge_index[0, lo:hi].copy_(nbr_pos)
            torch.add(row_pos, frontier_start_pos, out=edge_index[1, lo:hi])
            lo = hi
        batch = Data(edge_index=edge_index, n_id=n_id, batch_size=batch_size, num_nodes=int(n_id.numel()),
                     num_sampled_nodes=num_sampled_nodes, num_sampled_edges=num_sampled_edges,
                     edges_by_target=by_target)
        if hop_types:
            batch.edge_type = torch.cat(hop_types)
        if self.with_edges:
            batch.e_id = torch.cat(hop_egids).to(torch.long) if hop_egids else edge_index.new_empty(0)
            if self.edge_attr is not None:
                batch.edge_attr = torch.cat(hop_attrs)
        return batch

    __call__ = sample


class NeighborSampler(MultiHopSampler):
    """Multi-hop uniform neighbour sampler on one ``LocalCSR`` holding the whole graph (bounds ``[0, N]``).

    ``generator`` (on the CSR's device; ``None`` = torch's default one) makes batches reproducible; ``node_map``
    picks the dedup structure (see ``relabel.make_node_map``). Not thread-safe: one sampler per worker.
    """

    def __init__(self, csr: LocalCSR, fanouts: Iterable[Fanout], *, replace: bool = False,
                 generator: torch.Generator | None = None, node_map: str = "auto") -> None:
        if csr.start_gid != 0:
            raise ValueError(f"NeighborSampler needs the whole graph (start_gid 0, got {csr.start_gid}); "
                             f"use DistNeighborSampler for one partition of several")
        super().__init__(csr.num_nodes, fanouts, csr.device, replace=replace, generator=generator,
                         node_map=node_map)
        self.csr = csr

    def _sample_hop(self, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
        return sample_own_hop(self, self.csr, frontier_gid, fanout)


def sample_own_hop(sampler: MultiHopSampler, csr: LocalCSR, frontier_gid: Tensor, fanout: Fanout) -> HopEdges:
    """One hop of ``sampler`` where ``csr`` holds the in-edges of every frontier gid: the whole graph, or the one
    partition of a 1-rank ``DistNeighborSampler``. Draws from ``sampler.generator``."""
    frontier_lid = frontier_gid - csr.start_gid if csr.start_gid else frontier_gid   # lone rank: gid == lid
    _, row_pos, edge_idx, edge_type = sample_typed_edges(csr, frontier_lid, fanout,
                                                         replace=sampler.replace, generator=sampler.generator)
    with_attr = sampler.with_edges and sampler.edge_attr is not None
    return HopEdges(row_pos, csr.gids(edge_idx), edge_type, edge_idx + csr.start_egid if sampler.with_edges else None,
                    sampler.edge_attr.index_select(0, edge_idx) if with_attr and sampler.edge_attr is not None
                    else None, by_target=True)   # sample_typed_edges: grouped by target, then by edge type


def check_seed_range(seed_gid: Tensor, num_nodes: int, what: str = "seed gids") -> None:
    """ValueError unless every gid of the non-empty ``seed_gid`` lies in ``[0, num_nodes)`` (one host read);
    ``what``: the gids' name in the message."""
    lo, hi = torch.stack(torch.aminmax(seed_gid)).tolist()   # one host sync for both ends
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"{what} must lie in [0, {num_nodes}); got [{lo}, {hi}]")


def shuffled(train_gid: Tensor, generator: torch.Generator | None) -> Tensor:
    """``train_gid`` in a random order drawn from ``generator`` (on the generator's device)."""
    rand_device = generator.device if generator is not None else train_gid.device
    perm = torch.randperm(train_gid.numel(), generator=generator, device=rand_device)
    return train_gid[perm.to(train_gid.device)]


def iter_seed_batches(train_gid: Tensor, batch_size: int, *, generator: torch.Generator | None = None,
                      drop_last: bool = False, limit: int | None = None) -> Iterator[Tensor]:
    """One epoch: ``train_gid`` reshuffled with ``generator`` (its first ``limit``), cut into batches (the last may
    be short)."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    order_gid = shuffled(train_gid, generator)[:limit]
    stop = order_gid.numel() - (order_gid.numel() % batch_size if drop_last else 0)
    for lo in range(0, stop, batch_size):
        yield order_gid[lo:lo + batch_size]
