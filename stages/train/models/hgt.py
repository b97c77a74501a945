"""HGT (Hu et al. 2020, "Heterogeneous Graph Transformer") on blocks, with the parameters of PyG's ``HGTConv``.

Per layer, for a target v of type t and its in-edges u -e-> v (e the edge type, s = the source's type)::

    k_u, q_u, v_u = split(W_s h_u + b_s)                   one linear map per node type (``kqv_lin``), H heads of D
    k_ue = k_u K_e,  m_ue = v_u V_e                          one D x D map per (head, edge type) (``k_rel``, ``v_rel``)
    a_ue = softmax over v's in-edges of  q_v . k_ue * p_e / sqrt(D)   (``p_rel``: a prior per edge type and head)
    out_v = O_t gelu(sum_u a_ue m_ue) + c_t                  (``out_lin``), then the skip  s_t out_v + (1 - s_t) h_v
                                                             with s_t = sigmoid(skip_t)

which is what PyG's ``HGTConv`` computes on a ``HeteroData`` (``tests/test_typed_runtime.py`` checks it on a sampled
batch through ``to_hetero_data``), written on this project's one-layout typed batch (node and edge type per row and
edge, ``stages.train.models.blocks``) so that HGT runs layer by layer on blocks like the other relational bodies: layer
l maps only the sources of its block and attends only over its edges. One difference: a node type that is no edge type's
target gets the same update (PyG leaves it out of its output; with ``add_reverse`` every type is a target).

The layers' width is ``hidden``; the last layer adds a linear map to the classes (``head``), as PyG's HGT example
does (``out_channels`` need not be a multiple of the heads: ogbn-mag has 349 classes). Between layers only dropout:
the GELU inside each layer is HGT's non-linearity, and a ReLU on top cost 8 points of test accuracy on
synthetic-hetero (52.0 % against 60.3 %, tests/test_typed_train.py's configuration).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import HGTConv
from torch_geometric.utils import softmax

from stages.train.models.blocks import BatchGraph, Block
from stages.train.models.typed_model import _Layered, _widths

__all__ = ["BlockHGT"]


class BlockHGT(_Layered):
    """``num_layers`` ``HGTConv`` layers of ``hidden`` channels (``heads`` heads), then a linear map to the classes.
    ``node_types``: the names in schema order (type id = position); ``edge_types``: ``(src, rel, dst)`` triples in
    schema order (edge type id = position)."""

    needs_node_types = True
    # each layer maps its block's sources once and takes the targets' queries from them: the targets must be among
    # the sources it maps (a batch's prefix, a gathered chunk's), not anywhere in a layer matrix
    supports_offset_targets = False

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float, *,
                 node_types: Sequence[str], edge_types: Sequence[tuple[str, str, str]], heads: int = 4) -> None:
        super().__init__(num_layers, dropout, _widths(num_layers, hidden, out_channels))
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}")
        self.node_types, self.edge_types = list(node_types), [tuple(e) for e in edge_types]
        metadata = (self.node_types, self.edge_types)
        # features wider or narrower than hidden (a homogeneous graph's; a typed input is hidden wide already) are
        # mapped to hidden first, as PyG's HGT example does: every layer then has its skip connection, so every
        # parameter takes part in each step, as DDP expects
        self.lin_in = torch.nn.Linear(in_channels, hidden) if in_channels != hidden else None
        self.convs = torch.nn.ModuleList(HGTConv(hidden, hidden, metadata, heads=heads) for _ in range(num_layers))
        self.head = torch.nn.Linear(hidden, out_channels)
        self.heads = heads

    def forward(self, x: Tensor, edge_index: Tensor | None = None, edge_type: Tensor | None = None, *,
                blocks: list[Block] | None = None, node_type: Tensor | None = None) -> Tensor:
        if blocks is None:   # the whole graph: every layer on one block whose sources and targets are all nodes
            assert edge_index is not None, "HGT needs edges"
            n = x.shape[0]
            graph = BatchGraph(edge_index, n, n, None, edge_type=edge_type, num_edge_types=len(self.edge_types),
                               node_type=node_type)
            blocks = [Block(num_src=n, num_dst=n, num_edges=int(edge_index.shape[1]), graph=graph)] * self.num_layers
        return super().forward(x, blocks=blocks)

    def between(self, h: Tensor, training: bool) -> tuple[Tensor, float]:
        # the GELU inside each layer is HGT's non-linearity (module docstring; PyG's example stacks HGTConvs so)
        return torch.nn.functional.dropout(h, self.dropout_p, training), 1.0

    def step(self, i: int, h: Tensor, block: Block | None, edge_index: Tensor | None,
             edge_type: Tensor | None) -> Tensor:
        assert block is not None   # forward always passes blocks
        if i == 0 and self.lin_in is not None:
            h = self.lin_in(h[:block.num_src])
        out = self._conv(self.convs[i], h, block)
        return self.head(out) if i == self.num_layers - 1 else out

    def _conv(self, conv: Any, h: Tensor, block: Block) -> Tensor:
        heads, width = self.heads, conv.out_channels
        dim = width // heads
        src_type, dst_type = _types(block.src_node_type, block.num_src, h), _types(block.dst_node_type,
                                                                                     block.num_dst, h)
        kqv = _per_type(conv.kqv_lin.lins, self.node_types, h[:block.num_src], src_type)
        k, q, v = kqv.tensor_split(3, dim=1)
        q = block.dst_rows(q)
        src_pos, dst_pos = block.edge_index[0], block.edge_index[1]
        edge_type = block.edge_type if block.edge_type is not None else torch.zeros_like(src_pos)
        k_edge = self._relation(conv.k_rel.weight, k.index_select(0, src_pos).view(-1, heads, dim), edge_type)
        v_edge = self._relation(conv.v_rel.weight, v.index_select(0, src_pos).view(-1, heads, dim), edge_type)
        prior = torch.cat([conv.p_rel["__".join(e)] for e in self.edge_types])    # [R, heads]
        score = (q.index_select(0, dst_pos).view(-1, heads, dim) * k_edge).sum(-1)
        score = score * prior.index_select(0, edge_type) / math.sqrt(dim)
        attention = softmax(score, dst_pos, num_nodes=block.num_dst)             # over each target's in-edges
        message = (v_edge * attention.unsqueeze(-1)).view(-1, width)
        agg = message.new_zeros((block.num_dst, width)).index_add_(0, dst_pos, message)
        out = _per_type(conv.out_lin.lins, self.node_types, torch.nn.functional.gelu(agg), dst_type)
        x_dst = block.dst_rows(h)
        skip = torch.cat([conv.skip[t] for t in self.node_types]).sigmoid().index_select(0, dst_type).unsqueeze(1)
        return skip * out + (1 - skip) * x_dst.to(out.dtype)

    def _relation(self, weight: Tensor, rows: Tensor, edge_type: Tensor) -> Tensor:
        """``rows`` [E, heads, D] through their edge type's D x D map per head: PyG's ``HeteroLinear`` weight
        ``[heads * R, D, D]``, type ``head * R + e``."""
        num_rel = len(self.edge_types)
        w = weight.view(self.heads, num_rel, weight.shape[1], weight.shape[2])
        # [heads, n_e, D] @ [heads, D, D]: one batched product per edge type
        return _by_group(edge_type, num_rel, rows,
                         lambda e, part: torch.bmm(part.transpose(0, 1), w[:, e]).transpose(0, 1))


def _types(node_type: Tensor | None, n: int, like: Tensor) -> Tensor:
    """The rows' node types; a homogeneous batch carries none: all type 0."""
    return node_type if node_type is not None else torch.zeros(n, dtype=torch.long, device=like.device)


def _per_type(lins: Any, names: Sequence[str], x: Tensor, node_type: Tensor) -> Tensor:
    """Each row of ``x`` through its node type's ``Linear`` (``lins[name]``, a ``HeteroDictLinear``'s)."""
    return _by_group(node_type, len(names), x, lambda t, part: lins[names[t]](part))


def _by_group(group: Tensor, num_groups: int, x: Tensor, fn: Callable[[int, Tensor], Tensor]) -> Tensor:
    """``fn(g, rows of group g)`` put back at those rows (every row is in some group). A group without rows runs
    too: its parameters then take part in the graph with zero gradients, as DDP expects of every parameter in
    every step (a batch's last layer has paper targets only, so the other types' output maps see no row)."""
    out: Tensor | None = None
    for g in range(num_groups):
        idx = torch.nonzero(group == g).squeeze(1)
        part = fn(g, x.index_select(0, idx))
        if out is None:   # the dtype of the results (bfloat16 under autocast)
            out = part.new_zeros((x.shape[0], *part.shape[1:]))
        out.index_copy_(0, idx, part.to(out.dtype))
    assert out is not None, "at least one group"
    return out
