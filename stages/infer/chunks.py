"""A rank's own nodes cut into chunks for layer-wise inference (``stages.infer.layerwise``), and a chunk's in-edges.

ID spaces: ``lid`` (a rank's own nodes, ``gid - start_gid``), ``gid`` (the sources), ``row_pos`` (a target's
position in its chunk, ``lid - a``). A typed CSR has one row per (node, edge type) (``LocalCSR``); a chunk's edges
then carry their edge type, grouped by target then type, as the training sampler's are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from stages.runtime.collectives import max_over_ranks
from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.uniform import sample_typed_edges
from stages.runtime.segments import repeat_positions

_CPU = torch.device("cpu")
SAMPLE_BLOCK = 1024   # lids per sampling block: one generator each, chunks of sampled inference start at one

BlockGenerator = Callable[[int], torch.Generator]   # sampling block k -> its generator
ChunkEdges = tuple[Tensor, Tensor, Tensor | None]   # (row_pos, nbr_gid or edge_idx, edge_type or None for one type)


def node_indptr(csr: LocalCSR) -> Tensor:
    """``[n + 1]``: where each node's in-edges start, all its edge types' rows being one range."""
    return csr.indptr[::csr.num_edge_types]


def plan_chunks(indptr: Tensor, chunk_edges: int, align: int = 1) -> list[tuple[int, int]]:
    """Consecutive lid ranges ``[a, b)`` whose ``sum(in-degree + 1)`` is at most ``chunk_edges`` each (a node, or an
    ``align`` block, above that is a range of its own); they cover ``[0, n)``, and every ``a`` is a multiple of
    ``align`` (sampled inference draws per block of ``SAMPLE_BLOCK`` lids)."""
    n = indptr.numel() - 1
    if n <= 0:
        return []
    csum = (indptr[1:].to(torch.long) + torch.arange(1, n + 1, dtype=torch.long)).cpu()   # through lid i, inclusive
    # block ends (lids); arange(align, n) is empty (and must not be asked for) when n <= align
    inner = torch.arange(align, n, align, dtype=torch.long) if n > align else torch.empty(0, dtype=torch.long)
    ends = torch.cat([inner, torch.tensor([n])])
    at_end = csum.index_select(0, ends - 1)
    out, a, base = [], 0, 0
    while a < n:
        k = int(torch.searchsorted(at_end, base + chunk_edges, right=True))   # blocks [0, k) within the budget
        b = int(ends[max(k, a // align + 1) - 1])                              # at least the block starting at a
        out.append((a, b))
        base, a = int(csum[b - 1]), b
    return out


def equal_chunk_count(num_chunks: int) -> int:
    """The largest rank's chunk count (at least 1): every rank runs that many, the last ones empty. Collective."""
    return max_over_ranks(max(num_chunks, 1))


def chunk_edges_of(csr: LocalCSR, a: int, b: int, fanout: int, block_generator: BlockGenerator | None = None,
                   device: torch.device = _CPU) -> ChunkEdges:
    """``(row_pos, nbr_gid, edge_type)``: the in-edges of lids ``[a, b)`` (all of them, or up to ``fanout``
    sampled of each edge type), grouped by target in lid order (``row_pos`` = lid - a, non-decreasing), then by edge
    type; ``edge_type`` is None for a one-edge-type CSR. A sample is drawn per block of ``SAMPLE_BLOCK`` lids from
    that block's own generator (``block_generator(k)`` for block k; ``a`` is a block start), so it does not depend
    on how blocks are grouped into chunks. On ``device``: the exact slice of a one-type CSR is copied there and
    its positions computed there (on the host they cost ~9 ns an edge on 2 cores, 10 % of a CPU layer and the bulk
    of a GPU one: 357 M edge-steps at products scale); the other edges are drawn on the host and moved."""
    if fanout == -1 and csr.num_edge_types == 1 and b > a:   # a slice of the CSR: a view, no gather
        lo, hi = int(csr.indptr[a]), int(csr.indptr[b])
        # int64 (a copy of the slice) whatever the rank's CSR holds: a chunk's E entries, not the rank's edges
        return (repeat_positions(torch.diff(csr.indptr[a:b + 1]).to(device), hi - lo),
                csr.indices[lo:hi].to(device).to(torch.long), None)
    row_pos, edge_idx, edge_type = chunk_edge_ids(csr, a, b, fanout, block_generator)
    return row_pos.to(device), csr.gids(edge_idx).to(device), None if edge_type is None else edge_type.to(device)


def chunk_edge_ids(csr: LocalCSR, a: int, b: int, fanout: int, block_generator: BlockGenerator | None = None
                   ) -> ChunkEdges:
    """``chunk_edges_of`` with each edge's elid (its position in ``csr.indices``, its row of the rank's edge
    features) in place of its source gid: ``(row_pos, edge_idx, edge_type)``."""
    typed = csr.num_edge_types > 1
    if b <= a:   # a padding chunk (this rank has fewer chunks than the largest): no targets, no draws
        none = torch.empty(0, dtype=torch.long)
        return none, none, none if typed else None
    if fanout == -1 and not typed:   # a slice of the CSR
        lo, hi = int(csr.indptr[a]), int(csr.indptr[b])
        return repeat_positions(torch.diff(csr.indptr[a:b + 1]), hi - lo), torch.arange(lo, hi), None
    if fanout == -1:
        _, row_pos, edge_idx, edge_type = sample_typed_edges(csr, torch.arange(a, b, dtype=torch.long), -1)
        return row_pos, edge_idx, edge_type
    if block_generator is None or a % SAMPLE_BLOCK:
        raise ValueError("sampled chunks start at a block of SAMPLE_BLOCK lids and draw from its generator")
    rows, nbrs, types = [], [], []
    for start in range(a, b, SAMPLE_BLOCK):
        stop = min(start + SAMPLE_BLOCK, b)
        _, row_pos, edge_idx, edge_type = sample_typed_edges(csr, torch.arange(start, stop, dtype=torch.long),
                                                             fanout, generator=block_generator(start // SAMPLE_BLOCK))
        rows.append(row_pos + (start - a))
        nbrs.append(edge_idx)
        types.append(edge_type)
    return torch.cat(rows), torch.cat(nbrs), torch.cat([t for t in types if t is not None]) if typed else None


def chunk_sources(start_gid: int, num_targets: int, row_pos: Tensor, nbr_gid: Tensor) -> tuple[Tensor, Tensor]:
    """``(n_id, edge_index)`` of a chunk's block: ``n_id`` the targets' gids ``[start_gid, start_gid + T)`` then the
    distinct other sources; ``edge_index`` [2, E] in n_id positions (row 0 source, row 1 target)."""
    in_chunk = (nbr_gid >= start_gid) & (nbr_gid < start_gid + num_targets)
    src_pos = torch.empty_like(nbr_gid)
    inside = torch.nonzero(in_chunk).squeeze(1)
    outside = torch.nonzero(~in_chunk).squeeze(1)
    other_gid, other_slot = torch.unique(nbr_gid.index_select(0, outside), return_inverse=True)
    src_pos.index_copy_(0, inside, nbr_gid.index_select(0, inside) - start_gid)
    src_pos.index_copy_(0, outside, other_slot + num_targets)
    n_id = torch.cat([torch.arange(start_gid, start_gid + num_targets, dtype=torch.long), other_gid])
    return n_id, torch.stack([src_pos, row_pos.to(torch.long)])


