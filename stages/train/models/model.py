"""The GNN models and the one entry point the loops call, ``seed_logits``.

Built-ins (``build_model``): PyG's BasicGNN models GraphSAGE (mean), GCN and GAT, subclassed so that their
parameters, ``state_dict`` keys (``convs.<i>...``) and plain PyG ``forward(x, edge_index)`` stay PyG's, and extended
with the block protocol:

- **block protocol**: a module with ``supports_blocks`` true whose ``forward(x, *, blocks)`` takes the rows of the
  batch's ``n_id`` and the batch's blocks (``stages.train.models.blocks.make_blocks``, one per layer, first layer first)
  and returns the rows of the last block's targets, the seeds. Layer l computes only the nodes the next layer
  needs (docs/design.md §5). A module with ``needs_degrees`` true gets ``batch.deg`` (true in-degree + 1 of every
  ``n_id`` position, attached by the loader) through ``Block.deg``. Every flag a model may declare is named, with
  its meaning, by ``stages.train.models.model_contract.BlockModel`` and read by ``capabilities`` there.
- any other ``nn.Module`` is called as a plain PyG model, ``model(x, edge_index)`` on the whole sampled batch, or
  ``model(x, edge_index, edge_attr=...)`` when the batch carries edge features (an edge-aware model,
  ``stages.train.models.plugins.edge_dim_for``).

GCN in blocks (``BlockGCN``) normalises with the true graph degrees when the batch carries them: with fanout -1 it
is GCN on the whole graph; with sampling each row is an unbiased estimate of the full-neighbourhood sum, each
sampled message scaled by ``(n_v / s_v) / sqrt(d_u d_v)`` (``stages.train.models.blocks.BatchGraph.gcn_csr``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn.models import GAT, GCN, GraphSAGE

from stages.choices import MODELS
from stages.train.models.blocks import Block, make_blocks, relu_dropout, spmm, spmm_with_root
from stages.train.models.model_contract import capabilities, unwrapped
from storage.schema import GraphSchema

__all__ = ["MODELS", "BlockGAT", "BlockGCN", "BlockGraphSAGE", "build_model", "is_block_model", "needs_degrees",
           "seed_logits"]


class _BlockForward:
    """The block path shared by the built-ins (a mixin before the PyG class): ``forward(x, blocks=...)``."""

    convs: torch.nn.ModuleList
    norms: torch.nn.ModuleList
    num_layers: int
    training: bool
    needs_degrees = False
    needs_node_types = False
    # whether block_step is right for targets anywhere among the sources (``Block.dst_start``), not only first:
    # not through a conv that adds self loops by position (GATConv joins source i to target i)
    supports_offset_targets = False

    @property
    def supports_blocks(self) -> bool:
        # JumpingKnowledge mixes the layers' outputs and batch-wise norms need the whole batch: PyG's own forward
        return getattr(self, "jk_mode", None) is None and not getattr(self, "supports_norm_batch", False)

    def forward(self, x: Tensor, edge_index: Tensor | None = None, *args: Any, blocks: list[Block] | None = None,
                **kwargs: Any) -> Tensor:
        """PyG's forward without ``blocks``; with them, layer by layer on the blocks. Activation, norm and dropout see
        the rows a layer keeps (a batch norm in training mode takes its statistics over those rows)."""
        if blocks is None:
            return super().forward(x, edge_index, *args, **kwargs)  # type: ignore[misc]
        if len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks for a {self.num_layers}-layer model")
        plain = isinstance(self.act, torch.nn.ReLU) and all(isinstance(n, torch.nn.Identity) for n in self.norms)
        h, scale = x, 1.0
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = self.block_step(conv, h, block, scale)
            scale = 1.0
            if i == self.num_layers - 1:
                break
            if plain:
                h, scale = relu_dropout(h, self.dropout.p, self.training)
                continue
            h = self.act(h) if self.act is not None and self.act_first else h
            h = self.norms[i](h)
            h = self.act(h) if self.act is not None and not self.act_first else h
            h = self.dropout(h)
        return h

    def block_step(self, conv: Any, h: Tensor, block: Block, scale: float) -> Tensor:
        """``conv`` on ``block``: ``h`` holds at least the block's sources; returns its ``num_dst`` target rows.
        ``scale``: a factor the caller did not apply to ``h`` yet (dropout's 1 / (1 - p)), linear in every conv."""
        if scale != 1.0:
            h = h * scale
        return conv((h[:block.num_src], block.dst_rows(h)), block.edge_index, size=block.size)

    # PyG BasicGNN attributes the mixin reads
    act: Any
    dropout: torch.nn.Dropout
    act_first: bool


class BlockGraphSAGE(_BlockForward, GraphSAGE):
    """GraphSAGE: ``lin_l(mean of the sampled in-neighbours) + lin_r(self)``, per block."""

    supports_offset_targets = True

    def block_step(self, conv: Any, h: Tensor, block: Block, scale: float) -> Tensor:
        if conv.aggr != "mean" or conv.project or conv.normalize or not conv.root_weight:
            return super().block_step(conv, h, block, scale)
        agg, root = spmm_with_root(block.mean_adj(), h, block.dst_start)
        # addmm's alpha applies the pending dropout scale inside the GEMM, not as a pass over the rows
        bias = conv.lin_l.bias
        out = torch.addmm(bias, agg, conv.lin_l.weight.t(), alpha=scale) if bias is not None else \
            torch.mm(agg, conv.lin_l.weight.t()) * scale
        # in place (no copy of the output); in-place ops are not autocast: the operands take the output's dtype
        return out.addmm_(root.to(out.dtype), conv.lin_r.weight.t().to(out.dtype), alpha=scale)


class BlockGCN(_BlockForward, GCN):
    """GCN with the true degrees when the batch carries them (module docstring); aggregate, then transform."""

    needs_degrees = True
    supports_offset_targets = True

    @property
    def supports_blocks(self) -> bool:
        convs_plain = all(c.normalize and c.add_self_loops and not c.improved and not c.cached for c in self.convs)
        return convs_plain and super().supports_blocks

    def block_step(self, conv: Any, h: Tensor, block: Block, scale: float) -> Tensor:
        # (A h) W = A (h W): aggregating first multiplies num_dst rows instead of num_src (155 k vs 653 k)
        agg = spmm(block.gcn_adj(), h)
        weight = conv.lin.weight
        if conv.bias is None:
            return torch.mm(agg, weight.t()) * scale
        return torch.addmm(conv.bias, agg, weight.t(), alpha=scale)


class BlockGAT(_BlockForward, GAT):
    """GAT through PyG's bipartite ``GATConv``. On a bipartite input PyG (2.8) removes self loops and adds one from
    source i to target i for i < min(num_src, num_dst): here targets are a prefix of the sources, so that is each
    target's own loop, as on the whole batch (``tests/test_blocks.py`` checks outputs and gradients). The layer
    transforms the target rows twice (as sources and as targets), +25 % of layer 0's GEMM rows on a products batch.

    Built with ``edge_dim`` (a graph with edge features) its convs score attention with the edges' features too
    (``Block.edge_attr``); the added self loop gets the mean of its target's in-edges' features (GATConv's
    ``fill_value``), which a block has in full, so the block step still equals the whole batch's.
    """

    def block_step(self, conv: Any, h: Tensor, block: Block, scale: float) -> Tensor:
        if block.edge_attr is None:
            return super().block_step(conv, h, block, scale)
        if scale != 1.0:
            h = h * scale
        return conv((h[:block.num_src], block.dst_rows(h)), block.edge_index, edge_attr=block.edge_attr,
                    size=block.size)


def build_model(kind: str, *, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
                heads: int = 4, schema: GraphSchema | None = None, **kwargs: Any) -> torch.nn.Module:
    """A ``num_layers``-layer built-in GNN mapping ``in_channels`` features to ``out_channels`` logits; ``kwargs``
    go to the PyG model (``act``, ``norm``, ...). ``schema``: the graph's node and edge types, which rgcn, rgat and
    hgt tell apart (None: one of each)."""
    from stages.train.models import hgt, typed_model

    sizes = {"in_channels": in_channels, "hidden": hidden, "out_channels": out_channels, "num_layers": num_layers,
             "dropout": dropout, **kwargs}
    schema = schema or GraphSchema.homogeneous(0, None, 0)
    if kind == "rgcn":
        return typed_model.BlockRGCN(**sizes, num_relations=schema.num_edge_types)
    if kind == "rgat":
        return typed_model.BlockRGAT(**sizes, num_relations=schema.num_edge_types, heads=heads)
    if kind == "hgt":
        return hgt.BlockHGT(**sizes, node_types=[t.name for t in schema.node_types],
                            edge_types=[e.as_tuple() for e in schema.edge_types], heads=heads)
    if kind == "mlp":
        return typed_model.BlockMLP(**sizes)
    common = {"in_channels": in_channels, "hidden_channels": hidden, "num_layers": num_layers,
              "out_channels": out_channels, "dropout": dropout, **kwargs}
    if kind == "sage":
        return BlockGraphSAGE(**{"aggr": "mean", **common})
    if kind == "gcn":
        return BlockGCN(**common)
    if kind == "gat":
        return BlockGAT(**{"heads": heads, **common})
    raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")


def is_block_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the module DDP wraps) follows the block protocol."""
    return capabilities(model).supports_blocks


def needs_degrees(model: torch.nn.Module) -> bool:
    """Whether ``model``'s batches must carry ``batch.deg`` (the loader attaches it then)."""
    return capabilities(model).attach_degrees


def matmul_precision(precision: str) -> str:
    """``torch.set_float32_matmul_precision``'s setting for a run of ``precision``, process-wide: "high" for tf32
    (TensorFloat32 GEMMs on a GPU; on a CPU, oneDNN's reduced-precision path where it has one), else "highest",
    PyTorch's default, so that a float32 run after a tf32 one in the same process computes in float32 again."""
    return "high" if precision == "tf32" else "highest"


def seed_logits(model: torch.nn.Module, x: Tensor | dict[str, Tensor], batch: Data, *,
                precision: str = "float32") -> Tensor:
    """Logits of the batch's seeds (its first ``batch_size`` nodes): layer by layer on bipartite blocks for a block
    model, else the plain PyG call on the whole sampled batch. ``model`` may be DDP's wrapper (called through it).

    ``precision="bfloat16"``: the forward pass runs under ``torch.autocast`` to bfloat16 (matrix products in
    bfloat16 with float32 accumulation, 2.5x the float32 rate on this project's AVX512-BF16 CPU); the logits come
    back as float32, so the loss is computed in float32. The weights and their gradients stay float32.
    """
    if isinstance(x, dict):   # a typed batch: rows per node type (stages.train.models.typed_model.HeteroModel)
        return _typed_seed_logits(model, x, batch, precision)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        caps = capabilities(model)
        if caps.supports_blocks:
            block_model: Any = unwrapped(model)   # a block model's num_layers is an int (nn.Module says Tensor)
            out = model(x, blocks=make_blocks(batch, block_model.num_layers))[:batch.batch_size]
        elif caps.needs_node_types:   # a typed body (inference's whole-model path)
            out = model(x, batch.edge_index, getattr(batch, "edge_type", None),
                        node_type=batch.node_type)[:batch.batch_size]
        elif getattr(batch, "edge_attr", None) is not None:   # an edge-aware model (plugins.edge_dim_for)
            out = model(x, batch.edge_index, edge_attr=batch.edge_attr)[:batch.batch_size]
        else:
            out = model(x, batch.edge_index)[:batch.batch_size]
    return out.float() if precision == "bfloat16" else out


def _typed_seed_logits(model: torch.nn.Module, x_dict: dict[str, Tensor], batch: Data, precision: str) -> Tensor:
    device = batch.node_type.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        if is_block_model(model):
            block_model: Any = unwrapped(model)
            out = model(x_dict, node_type=batch.node_type,
                        blocks=make_blocks(batch, block_model.num_layers))[:batch.batch_size]
        else:
            out = model(x_dict, node_type=batch.node_type, edge_index=batch.edge_index,
                        edge_type=getattr(batch, "edge_type", None))[:batch.batch_size]
    return out.float() if precision == "bfloat16" else out
