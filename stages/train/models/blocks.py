"""Per-layer (block) computation on a sampled batch (docs/design.md §5): the layout, the aggregation, the activation.

A batch from the samplers lists ``n_id`` as seeds, hop 1's new nodes, hop 2's, ... and ``edge_index`` hop by hop,
hop k's edges pointing into hop k-1's new nodes. Layer l (0-based) of an L-layer model therefore needs outputs only
for the nodes within L-1-l hops of the seeds (a prefix of ``n_id``: ``num_dst``) from messages of the nodes within
L-l hops (``num_src``), along the edges of hops 1..L-l (a prefix of ``edge_index``: ``num_edges``)::

    num_dst = sum(num_sampled_nodes[:L-l]),  num_src = sum(num_sampled_nodes[:L-l+1]),
    num_edges = sum(num_sampled_edges[:L-l])

so each layer is one bipartite step ``conv((h[:num_src], h[:num_dst]), edge_index[:, :num_edges], size=(num_src,
num_dst))``. Unlike PyG's ``trim_to_layer``, layer 0 computes 155 k rows instead of all 653 k sampled nodes (products
batch, fanouts [15, 10, 5]), and the activation and dropout run over the rows a layer keeps.

Every target of a block has all its sampled in-edges in the block, so the block's aggregation equals the whole-batch
one. The edges of all blocks, sorted by target once per batch (``BatchGraph``), form one CSR whose row prefixes are
the blocks: the aggregation is a CSR sparse-dense product (``_sparse_mm``), without PyG's gather of every edge's
message (layer 0 of that batch: 84-102 ms against 287 ms for PyG's gather + scatter).
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.segments import bin_counts, offsets_of, repeat_positions, stable_order

__all__ = ["BatchGraph", "Block", "SparseAdj", "make_blocks", "relu_dropout", "spmm", "spmm_with_root", "stable_order"]


class SparseAdj:
    """A block's ``[num_dst, num_src]`` aggregation matrix in CSR (rows: targets), its transpose built on demand."""

    def __init__(self, crow: Tensor, col: Tensor, values: Tensor, num_src: int, num_dst: int) -> None:
        self.crow, self.col, self.values = crow, col, values
        self.num_src, self.num_dst = num_src, num_dst

    def matrix(self) -> Tensor:
        return _csr(self.crow, self.col, self.values, (self.num_dst, self.num_src))

    @cached_property
    def transposed(self) -> Tensor:
        """``[num_src, num_dst]`` CSR of the transpose, for the backward pass."""
        row_pos = repeat_positions(torch.diff(self.crow), self.col.numel())
        order = stable_order(self.col, self.num_src)
        count = bin_counts(self.col, self.num_src)
        crow_t = offsets_of(count)
        return _csr(crow_t, row_pos.index_select(0, order), self.values.index_select(0, order),
                    (self.num_src, self.num_dst))


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    # the invariants hold by construction; checking them would cost a pass over the entries per product
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, size=size, check_invariants=False)


def _sparse_mm(a: Tensor, h: Tensor) -> Tensor:
    """``a @ h`` for a CSR ``a``. On CPU torch's row-parallel kernel (``reduce="sum"``) writes each output row once:
    54 ms for the backward of a products batch's layer 1 where MKL's (zero-fill, product, copy) took 193 ms. The
    sparse kernels take float32/float64: bfloat16 rows (under autocast) are widened."""
    with torch.autocast(h.device.type, enabled=False):
        h = h.to(a.dtype).contiguous()
        return torch.sparse.mm(a, h, "sum") if h.device.type == "cpu" else torch.sparse.mm(a, h)


class _Aggregate(torch.autograd.Function):
    """``(A @ h[:num_src], copy of h[:num_dst])`` for a constant ``A``: the backward multiplies by the transpose and
    adds the root's gradient into the first rows in place. Autograd's slice of ``h`` for the root would instead
    allocate and zero a gradient of all of ``h``'s rows (158 MB, 85 ms at layer 1 of a products batch)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, adj: SparseAdj, with_root: bool, dst_start: int = 0) -> Any:
        ctx.adj, ctx.num_rows, ctx.with_root, ctx.dst_start = adj, h.shape[0], with_root, dst_start
        agg = _sparse_mm(adj.matrix(), h[:adj.num_src])
        return (agg, h[dst_start:dst_start + adj.num_dst].clone()) if with_root else agg

    @staticmethod
    def backward(ctx: Any, grad_agg: Tensor, grad_root: Tensor | None = None) -> Any:
        adj: SparseAdj = ctx.adj
        grad_src = _sparse_mm(adj.transposed, grad_agg)
        if ctx.num_rows == adj.num_src:
            grad_h = grad_src
        else:
            grad_h = grad_src.new_zeros((ctx.num_rows, grad_src.shape[1]))
            grad_h[:adj.num_src] = grad_src
        if grad_root is not None:
            grad_h[ctx.dst_start:ctx.dst_start + adj.num_dst] += grad_root
        return grad_h, None, None, None


def spmm(adj: SparseAdj, h: Tensor) -> Tensor:
    """``adj @ h[:adj.num_src]``: ``[num_dst, C]``, differentiable in ``h``."""
    if not h.requires_grad:
        return _sparse_mm(adj.matrix(), h[:adj.num_src])
    return _Aggregate.apply(h, adj, False)


def spmm_with_root(adj: SparseAdj, h: Tensor, dst_start: int = 0) -> tuple[Tensor, Tensor]:
    """``(adj @ h[:adj.num_src], h[dst_start:dst_start + adj.num_dst])`` (the targets' own rows), differentiable in
    ``h`` (see ``_Aggregate``)."""
    if not h.requires_grad:
        return _sparse_mm(adj.matrix(), h[:adj.num_src]), h[dst_start:dst_start + adj.num_dst]
    return _Aggregate.apply(h, adj, True, dst_start)


class BatchGraph:
    """The batch's edges sorted by target, once for all its blocks, and the per-model aggregation values.

    ``deg`` (float, one per ``n_id`` position): the true in-degree + 1 that the loader attached (``batch.deg``), or
    ``None``: then GCN normalises with the sampled subgraph's degrees, as PyG's GCN on the whole batch does.

    The targets are the nodes ``[dst_start, dst_start + num_targets)`` (``edge_index[1]`` counts from
    ``dst_start``): a batch's are its first nodes (0); layer-wise inference aggregates a chunk of a rank's nodes
    straight from the layer's matrix of all of them (``stages.infer.halo``), where the chunk starts anywhere.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, num_targets: int, deg: Tensor | None,
                 dst_start: int = 0, edge_type: Tensor | None = None, num_edge_types: int = 1,
                 node_type: Tensor | None = None, edge_attr: Tensor | None = None, by_target: bool = False) -> None:
        src_pos, dst_pos = edge_index[0], edge_index[1]
        # the single-partition sampler emits edges grouped by target (``by_target``: the caller knows, and the
        # check, a host synchronisation on a GPU, is skipped); the distributed one groups each hop's answers by
        # owner rank, so its targets need a (stable) sort; typed edges are sorted by (target, edge type), which
        # keeps them grouped by target
        key_pos = dst_pos if edge_type is None else dst_pos * num_edge_types + edge_type
        if not by_target and key_pos.numel() > 1 and not bool((key_pos[1:] >= key_pos[:-1]).all()):
            order = stable_order(key_pos, num_targets * num_edge_types)
            src_pos, dst_pos = src_pos.index_select(0, order), dst_pos.index_select(0, order)
            key_pos = key_pos.index_select(0, order)
        self.col, self.row = src_pos, dst_pos                 # CSR entries: source position, target position
        self.count = bin_counts(dst_pos, num_targets)   # sampled in-edges per target
        self.crow = offsets_of(self.count)
        self.num_nodes, self.num_targets, self.true_deg = num_nodes, num_targets, deg
        self.dst_start = dst_start
        self.edge_index, self.edge_type, self.num_edge_types = edge_index, edge_type, num_edge_types
        self.node_type = node_type   # a typed graph's node type of each source position (HGT's per-type maps)
        # [E, D] aligned with ``edge_index`` (the batch's order, not the CSR's sorted one): what PyG's edge-aware
        # convs take beside ``edge_index``; a CSR consumer would permute it by the sort above
        self.edge_attr = edge_attr
        self._key_pos = key_pos

    @cached_property
    def relation_csr(self) -> tuple[Tensor, Tensor]:
        """``(crow, values)`` over (target, edge type) rows ``dst * R + e``: each entry's ``1 / count`` of its
        row, the mean over a target's sampled in-neighbours of one edge type (R-GCN). Entries as ``col``."""
        count = bin_counts(self._key_pos, self.num_targets * self.num_edge_types)
        crow = offsets_of(count)
        return crow, count.clamp(min=1).to(torch.float32).reciprocal().index_select(0, self._key_pos)

    @cached_property
    def mean_values(self) -> Tensor:
        """``1 / count(target)`` per entry: the mean over the sampled neighbours (SAGE)."""
        return self.count.clamp(min=1).to(torch.float32).reciprocal().index_select(0, self.row)

    @cached_property
    def gcn_csr(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(crow, col, values)`` of GCN's matrix with the self loop first in each row (docs/design.md §5)::

            self loop: 1 / d_v;   sampled edge u -> v: (n_v / s_v) / sqrt(d_u d_v)

        ``d`` = in-degree + 1, ``n_v`` = d_v - 1 the true in-degree, ``s_v`` the sampled in-edges of v. Each of
        v's n_v neighbours is sampled with probability s_v / n_v, so the row is an unbiased estimate of the full
        neighbourhood's sum; with fanout -1 (s_v = n_v) it is GCN's own normalisation. Without true degrees d is
        the sampled subgraph's (then n_v = s_v): PyG's GCN on the whole batch. Sampled self loops are dropped, as
        PyG's ``add_remaining_self_loops`` does (canonical graphs have none).
        """
        device = self.row.device
        t, ds = self.num_targets, self.dst_start
        not_loop = self.col != self.row + ds
        row, col = self.row[not_loop], self.col[not_loop]
        count = bin_counts(row, t)
        # only the entries' degrees: the sources may be a whole layer matrix (stages.infer.halo), 100x a chunk
        if self.true_deg is None:   # the subgraph's: in-edges + 1 for a target, 1 for any other source
            deg_t = count.to(torch.float32) + 1
            col_deg = torch.ones(col.numel(), dtype=torch.float32, device=device)
            is_target = (col >= ds) & (col < ds + t)
            col_deg[is_target] = deg_t.index_select(0, col[is_target] - ds)
            scale = torch.ones(t, device=device)
        else:
            deg = self.true_deg.to(torch.float32)
            deg_t, col_deg = deg[ds:ds + t], deg.index_select(0, col)
            scale = (deg_t - 1) / count.clamp(min=1)
        crow = offsets_of(count + 1)   # one more entry per row: its loop
        edge_slot = torch.arange(row.numel(), device=device) + row + 1
        out_col = torch.empty(row.numel() + t, dtype=torch.long, device=device)
        val = torch.empty(row.numel() + t, dtype=torch.float32, device=device)
        out_col.index_copy_(0, crow[:-1], torch.arange(ds, ds + t, device=device))
        val.index_copy_(0, crow[:-1], deg_t.reciprocal())
        out_col.index_copy_(0, edge_slot, col)
        val.index_copy_(0, edge_slot, (scale * deg_t.rsqrt()).index_select(0, row) * col_deg.rsqrt())
        return crow, out_col, val


@dataclass(frozen=True)
class Block:
    """One layer's bipartite step: sources are the first ``num_src`` nodes, targets the ``num_dst`` from
    ``dst_start`` (a batch's first ones; a chunk of a layer matrix's own rows in layer-wise inference)."""

    num_src: int
    num_dst: int
    num_edges: int
    graph: BatchGraph

    @property
    def edge_index(self) -> Tensor:
        """``[2, num_edges]`` (row 0: source position < num_src, row 1: target position < num_dst)."""
        return self.graph.edge_index[:, :self.num_edges]

    @property
    def size(self) -> tuple[int, int]:
        return self.num_src, self.num_dst

    @property
    def dst_start(self) -> int:
        """The first target's source position (``BatchGraph``): 0 in a batch."""
        return self.graph.dst_start

    def dst_rows(self, h: Tensor) -> Tensor:
        """The targets' own rows of ``h`` (rows of the sources)."""
        return h[self.dst_start:self.dst_start + self.num_dst]

    @property
    def deg(self) -> Tensor | None:
        """True in-degree + 1 of the sources (``batch.deg``), when the loader attached it."""
        return None if self.graph.true_deg is None else self.graph.true_deg[:self.num_src]

    def mean_adj(self) -> SparseAdj:
        """The mean over each target's sampled in-neighbours."""
        g = self.graph
        return SparseAdj(g.crow[:self.num_dst + 1], g.col[:self.num_edges], g.mean_values[:self.num_edges],
                         self.num_src, self.num_dst)

    def relation_mean_adj(self) -> SparseAdj:
        """``[num_dst * R, num_src]``: row ``v * R + e`` is the mean over v's sampled type-e in-neighbours."""
        g = self.graph
        crow, values = g.relation_csr
        rows = self.num_dst * g.num_edge_types
        return SparseAdj(crow[:rows + 1], g.col[:self.num_edges], values[:self.num_edges], self.num_src, rows)

    @property
    def edge_attr(self) -> Tensor | None:
        """``[num_edges, D]`` features of the ``edge_index`` columns, when the batch carries them."""
        return None if self.graph.edge_attr is None else self.graph.edge_attr[:self.num_edges]

    @property
    def edge_type(self) -> Tensor | None:
        """The edge type of each ``edge_index`` column (typed batches)."""
        return None if self.graph.edge_type is None else self.graph.edge_type[:self.num_edges]

    @property
    def src_node_type(self) -> Tensor | None:
        """The node type of each source (typed batches)."""
        return None if self.graph.node_type is None else self.graph.node_type[:self.num_src]

    @property
    def dst_node_type(self) -> Tensor | None:
        """The node type of each target (typed batches)."""
        return None if self.graph.node_type is None else self.dst_rows(self.graph.node_type)

    def gcn_adj(self) -> SparseAdj:
        """GCN's normalised matrix, self loops included (``BatchGraph.gcn_csr``)."""
        crow, col, val = self.graph.gcn_csr
        nnz = int(crow[self.num_dst])
        return SparseAdj(crow[:self.num_dst + 1], col[:nnz], val[:nnz], self.num_src, self.num_dst)


def make_blocks(batch: Data, num_layers: int) -> list[Block]:
    """The ``num_layers`` blocks of ``batch``, first layer first (module docstring)."""
    hops = len(batch.num_sampled_edges)
    if not 1 <= num_layers <= hops:
        raise ValueError(f"a {num_layers}-layer model needs 1 to {hops} sampled hops, the batch has {hops}")
    nodes = [0, *itertools.accumulate(batch.num_sampled_nodes)]   # nodes[k]: within k-1 hops ... (prefix sums)
    edges = [0, *itertools.accumulate(batch.num_sampled_edges)]
    deg = getattr(batch, "deg", None)
    edge_type = getattr(batch, "edge_type", None)
    edge_attr = getattr(batch, "edge_attr", None)
    # a sampler that emitted every hop grouped by target (MultiHopSampler.sample) also kept each hop's edges on
    # its frontier's run of targets: both layout checks below hold by construction (2 host syncs a batch on a GPU)
    by_target = bool(getattr(batch, "edges_by_target", False))
    graph = BatchGraph(batch.edge_index[:, :edges[num_layers]], nodes[num_layers + 1], nodes[num_layers], deg,
                       edge_type=None if edge_type is None else edge_type[:edges[num_layers]],
                       num_edge_types=int(getattr(batch, "num_relations", 1)),
                       node_type=getattr(batch, "node_type", None),
                       edge_attr=None if edge_attr is None else edge_attr[:edges[num_layers]], by_target=by_target)
    # hop k's edges end where the targets within k-1 hops do: one read of the device for every hop
    hop_ends = edges[1:num_layers + 1]
    if not by_target and torch.stack([graph.crow[nodes[k]] for k in range(1, num_layers + 1)]).tolist() != hop_ends:
        raise ValueError("batch layout: hop k's edges must point into hop k-1's new nodes")
    return [Block(num_src=nodes[k + 1], num_dst=nodes[k], num_edges=edges[k], graph=graph)
            for k in range(num_layers, 0, -1)]   # layer l's messages come from within k = num_layers - l hops


def _keep_mask(h: Tensor, p: float) -> Tensor:
    """Bernoulli(1 - p) as 1.0 / 0.0 in ``h``'s shape and dtype, from 8 random bits per element (16 when ``p * 256``
    is not whole: then the drop probability is ``p`` rounded to a multiple of 2^-16). On a products batch's layer 0
    (40 M elements, 1 thread) ``bernoulli_`` took 587 ms, ``rand() >= p`` 226 ms, these bits 17 ms and the compare
    13 ms; the compare writes ``h``'s dtype, because multiplying by a bool mask first converts it (+60 ms)."""
    bits = 8 if float(p * 256).is_integer() else 16
    numel = h.numel()
    words = torch.empty(-(-numel * bits // 64), dtype=torch.int64, device=h.device).random_(-2**63, None)
    signed = words.view(torch.int8 if bits == 8 else torch.int16)[:numel].view(h.shape)   # uniform, signed
    return torch.ge(signed, round(p * 2**bits) - 2**(bits - 1), out=torch.empty_like(h))


class _ReluDropout(torch.autograd.Function):
    """``relu(h) * keep`` in place, unscaled; the backward passes the gradient where the output is positive."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, p: float) -> Tensor:
        keep = _keep_mask(h, p)
        ctx.mark_dirty(h)
        out = h.relu_().mul_(keep)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        (out,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad_out, out, 0), None


def relu_dropout(h: Tensor, p: float, training: bool) -> tuple[Tensor, float]:
    """``dropout(relu(h), p)`` as ``(z, scale)``: the caller multiplies by ``scale`` (``1 / (1 - p)`` when
    dropping) inside its next linear map (GEMM's alpha), which saves a pass over the rows. ``h`` is overwritten
    when training: it must be a result no backward needs (an ``addmm``'s output is one)."""
    if not training or p == 0.0:
        return torch.relu(h), 1.0
    return _ReluDropout.apply(h, p), 1.0 / (1.0 - p)
