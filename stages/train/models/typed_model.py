"""Relational models and the typed input: R-GCN, R-GAT, an MLP baseline, and ``HeteroModel`` (input + body).

A typed batch is laid out as PyG's ``to_homogeneous`` lays a typed graph out: one ``n_id``, each node's type
(``batch.node_type``) and each edge's type (``batch.edge_type``, the schema's edge type ids). Its rows arrive per
node type (``x_dict``: features of a featured type, learnt embeddings of a featureless one). ``HeteroModel`` maps
them to one ``[n, hidden]`` matrix (``TypedInput``: a linear map per featured type, embeddings as they are) and runs
a body on it: a relational model (``rgcn``, ``rgat``), a homogeneous one that ignores the types (``sage``, ``gcn``,
``gat``: the baseline that shows what the types are worth) or ``mlp`` (each seed's own row only).

The relational layers follow the block protocol (``stages.train.models.model``), with one more matrix per block: row
``v * R + e`` of ``Block.relation_mean_adj`` averages v's sampled type-e in-neighbours, so R-GCN's
``sum_e W_e mean_e(h)`` is one sparse product and one GEMM (``[num_dst, R * in] @ [R * in, out]``) instead of R
of each. Parameters are PyG's ``RGCNConv`` / ``GATConv``'s, so the whole-batch path is PyG's own call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, RGCNConv

from stages.runtime.typed_batch import TypeSplit
from stages.train.models.blocks import Block, relu_dropout, spmm
from stages.train.models.model_contract import capabilities

__all__ = ["BlockMLP", "BlockRGAT", "BlockRGCN", "HeteroBody", "HeteroModel", "TypedInput"]


class _Layered(torch.nn.Module):
    """ReLU and dropout between ``num_layers`` steps, on blocks or on the whole batch."""

    supports_blocks = True
    needs_degrees = False
    supports_offset_targets = True   # a block's targets are its ``dst_rows`` (layer-wise inference: anywhere)
    needs_node_types = False

    def __init__(self, num_layers: int, dropout: float, widths: list[int]) -> None:
        super().__init__()
        self.num_layers, self.dropout_p, self.widths = num_layers, dropout, widths

    def layer_width(self, i: int) -> int:
        return self.widths[i]

    def infer_step(self, i: int, h: Tensor, block: Block) -> Tensor:
        """Layer ``i`` of ``block``'s targets in eval mode, its ReLU included but for the last layer (layer-wise
        inference, ``stages.infer.layerwise``)."""
        out = self.step(i, h, block, None, None)
        return out if i == self.num_layers - 1 else self.between(out, False)[0]

    def between(self, h: Tensor, training: bool) -> tuple[Tensor, float]:
        """What runs between two layers: ReLU and dropout, as ``(rows, pending scale)`` (``relu_dropout``)."""
        return relu_dropout(h, self.dropout_p, training)

    def step(self, i: int, h: Tensor, block: Block | None, edge_index: Tensor | None,
             edge_type: Tensor | None) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, edge_index: Tensor | None = None, edge_type: Tensor | None = None, *,
                blocks: list[Block] | None = None) -> Tensor:
        if blocks is not None and len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks for a {self.num_layers}-layer model")
        if edge_index is not None and edge_type is None:   # one edge type (a homogeneous graph)
            edge_type = edge_index.new_zeros(edge_index.shape[1])
        h = x
        for i in range(self.num_layers):
            h = self.step(i, h, None if blocks is None else blocks[i], edge_index, edge_type)
            if i < self.num_layers - 1:
                h, scale = self.between(h, self.training)
                h = h * scale if scale != 1.0 else h
        return h


def _channels(i: int, num_layers: int, in_channels: int, hidden: int, out_channels: int) -> tuple[int, int]:
    return (in_channels if i == 0 else hidden), (out_channels if i == num_layers - 1 else hidden)


def _widths(num_layers: int, hidden: int, out_channels: int) -> list[int]:
    return [out_channels if i == num_layers - 1 else hidden for i in range(num_layers)]


class BlockRGCN(_Layered):
    """R-GCN (Schlichtkrull et al. 2018) with mean aggregation per relation: ``W_root h_v + sum_e W_e mean_{u in
    N_e(v)} h_u + b``, PyG's ``RGCNConv(aggr="mean")`` per layer."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float, *,
                 num_relations: int) -> None:
        super().__init__(num_layers, dropout, _widths(num_layers, hidden, out_channels))
        self.num_relations = num_relations
        self.convs = torch.nn.ModuleList(
            RGCNConv(*_channels(i, num_layers, in_channels, hidden, out_channels), num_relations, aggr="mean")
            for i in range(num_layers))

    def step(self, i: int, h: Tensor, block: Block | None, edge_index: Tensor | None,
             edge_type: Tensor | None) -> Tensor:
        conv: Any = self.convs[i]
        if block is None:
            return conv(h, edge_index, edge_type)
        agg = spmm(block.relation_mean_adj(), h)                       # [num_dst * R, in]
        num_dst, r, c_in = block.num_dst, self.num_relations, h.shape[1]
        out = torch.addmm(conv.bias, agg.view(num_dst, r * c_in), conv.weight.view(r * c_in, -1))
        # in place (no copy); in-place ops are not autocast: the operands take the output's dtype
        return out.addmm_(block.dst_rows(h).to(out.dtype), conv.root.to(out.dtype))


class BlockRGAT(_Layered):
    """R-GAT as the MLPerf GNN benchmark trains it: one ``GATConv`` per relation (no self loops), summed, plus a
    linear map of the node's own row (a node with no in-edge of any relation keeps its own signal). Hidden layers
    concatenate ``heads`` heads of ``hidden / heads``; the last averages them."""

    # GATConv maps every source row it is given: from a whole layer matrix that is every row of the matrix for every
    # chunk (chunks x N rows a layer; a review counted 8 000 rows against 4 387 gathered on a 400-node graph of 19
    # chunks), so layer-wise inference gathers each chunk's sources instead
    supports_offset_targets = False

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float, *,
                 num_relations: int, heads: int = 4) -> None:
        super().__init__(num_layers, dropout, _widths(num_layers, hidden, out_channels))
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}")
        self.num_relations = num_relations
        self.convs = torch.nn.ModuleList()
        self.roots = torch.nn.ModuleList()
        for i in range(num_layers):
            c_in, c_out = _channels(i, num_layers, in_channels, hidden, out_channels)
            last = i == num_layers - 1
            self.convs.append(torch.nn.ModuleList(
                GATConv(c_in, c_out if last else c_out // heads, heads=heads, concat=not last, add_self_loops=False)
                for _ in range(num_relations)))
            self.roots.append(torch.nn.Linear(c_in, c_out))

    def step(self, i: int, h: Tensor, block: Block | None, edge_index: Tensor | None,
             edge_type: Tensor | None) -> Tensor:
        if block is not None:
            edge_index, edge_type = block.edge_index, block.edge_type
            if edge_type is None:
                edge_type = edge_index.new_zeros(edge_index.shape[1])
            src, dst, size = h[:block.num_src], block.dst_rows(h), block.size
        else:
            src, dst, size = h, h, None
        assert edge_index is not None and edge_type is not None, "R-GAT needs edge types"
        out = self.roots[i](dst)
        convs: Any = self.convs[i]
        for e, conv in enumerate(convs):
            ei = edge_index[:, torch.nonzero(edge_type == e).squeeze(1)]
            out = out + conv((src, dst), ei, size=size)
        return out


class BlockMLP(_Layered):
    """Each seed's own row through ``num_layers`` linear layers: the no-graph baseline (on blocks, only the seeds'
    rows are computed)."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float) -> None:
        super().__init__(num_layers, dropout, _widths(num_layers, hidden, out_channels))
        self.lins = torch.nn.ModuleList(torch.nn.Linear(*_channels(i, num_layers, in_channels, hidden, out_channels))
                                        for i in range(num_layers))

    def forward(self, x: Tensor, edge_index: Tensor | None = None, edge_type: Tensor | None = None, *,
                blocks: list[Block] | None = None) -> Tensor:
        if blocks is not None:
            x = x[:blocks[-1].num_dst]
        return super().forward(x, edge_index, edge_type)

    def step(self, i: int, h: Tensor, block: Block | None, edge_index: Tensor | None,
             edge_type: Tensor | None) -> Tensor:
        return self.lins[i](h if block is None else block.dst_rows(h))


class TypedInput(torch.nn.Module):
    """``x_dict`` -> ``[n, hidden]`` in batch order: a linear map per featured type; a featureless type's rows (its
    embeddings, ``hidden`` wide) as they come."""

    def __init__(self, in_channels: Mapping[str, int | None], hidden: int) -> None:
        super().__init__()
        self.type_names = tuple(in_channels)
        self.hidden = hidden
        self.lins = torch.nn.ModuleDict({t: torch.nn.Linear(f, hidden) for t, f in in_channels.items() if f})

    @property
    def dtype(self) -> torch.dtype:
        ref = next(iter(self.lins.parameters()), None)
        return ref.dtype if ref is not None else torch.float32

    def encode(self, node_type: str, rows: Tensor) -> Tensor:
        """One node type's rows as ``[m, hidden]``: mapped (a featured type), or as they are (an embedding)."""
        if node_type in self.lins:
            return self.lins[node_type](rows.to(self.dtype))
        return rows.to(self.dtype)

    def forward(self, x_dict: Mapping[str, Tensor], node_type: Tensor) -> Tensor:
        h = torch.zeros((node_type.numel(), self.hidden), dtype=self.dtype, device=node_type.device)
        for t, name in enumerate(self.type_names):
            h = h.index_copy(0, torch.nonzero(node_type == t).squeeze(1), self.encode(name, x_dict[name]).to(h.dtype))
        return h


class HeteroBody(torch.nn.Module):
    """A typed plug-in (``examples/hetero_model.py``: ``forward(x_dict, edge_index_dict) -> {type: out}``, PyG's
    ``HeteroData`` API) as a body of the one layout: the rows and edges split per type (``TypeSplit``), every node
    and edge type present (empty ones too: then each parameter takes part in every step, as DDP expects), and the
    outputs put back in batch order (a type the module gives no output keeps zero rows). Runs on the whole
    sampled batch (no blocks)."""

    needs_node_types = True
    supports_blocks = False
    needs_degrees = False
    supports_offset_targets = False

    def __init__(self, module: torch.nn.Module, node_types: Sequence[str],
                 edge_types: Sequence[tuple[str, str, str]]) -> None:
        super().__init__()
        self.module, self.node_types, self.edge_types = module, list(node_types), [tuple(e) for e in edge_types]

    def forward(self, h: Tensor, edge_index: Tensor, edge_type: Tensor | None = None, *,
                node_type: Tensor) -> Tensor:
        split = TypeSplit.of(node_type, edge_index, edge_type, len(self.node_types), len(self.edge_types))
        x_dict = {t: h.index_select(0, pos) for t, pos in zip(self.node_types, split.node_pos)}
        out_dict = self.module(x_dict, dict(zip(self.edge_types, split.edge_index)))
        if not isinstance(out_dict, Mapping):
            raise TypeError(f"a typed plug-in returns a dict of outputs per node type, got a {type(out_dict).__name__}")
        out: Tensor | None = None
        for t, pos in zip(self.node_types, split.node_pos):
            rows = out_dict.get(t)
            if rows is None:
                continue
            if out is None:
                out = rows.new_zeros((h.shape[0], rows.shape[1]))
            out = out.index_copy(0, pos, rows)
        if out is None:
            raise ValueError(f"the typed plug-in gave no output for any node type ({', '.join(self.node_types)})")
        return out


class HeteroModel(torch.nn.Module):
    """``TypedInput`` then ``body`` (a block model or a plain PyG one taking ``(x, edge_index)``). Blocks and degrees
    as the body declares them."""

    supports_offset_targets = False   # never run layer by layer itself: inference runs its body (infer.model_input)
    needs_node_types = False          # called on ``x_dict`` by keyword (``seed_logits``' typed path), not this way

    def __init__(self, encoder: TypedInput, body: torch.nn.Module) -> None:
        super().__init__()
        self.encoder, self.body = encoder, body

    @property
    def supports_blocks(self) -> bool:
        return capabilities(self.body).supports_blocks

    @property
    def needs_degrees(self) -> bool:
        return capabilities(self.body).needs_degrees

    @property
    def num_layers(self) -> int:
        body: Any = self.body
        return int(body.num_layers)

    @property
    def relational(self) -> bool:
        """Whether the body takes the edge types (the built-in bodies of this module and
        ``stages.train.models.hgt``)."""
        return isinstance(self.body, _Layered)

    def forward(self, x_dict: Mapping[str, Tensor], *, node_type: Tensor, edge_index: Tensor | None = None,
                edge_type: Tensor | None = None, blocks: list[Block] | None = None) -> Tensor:
        h = self.encoder(x_dict, node_type)
        if blocks is not None:
            return self.body(h, blocks=blocks)
        if capabilities(self.body).needs_node_types:
            return self.body(h, edge_index, edge_type, node_type=node_type)
        if self.relational:
            return self.body(h, edge_index, edge_type)
        return self.body(h, edge_index)
