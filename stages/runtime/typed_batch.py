"""A typed sampled batch as PyG's ``HeteroData``, laid out as PyG's ``NeighborLoader`` lays out a hetero batch.

The samplers return one ``Data`` in PyG's ``to_homogeneous`` layout (``n_id`` gids, ``edge_type`` per edge; the
loader adds ``node_type`` per node): what the relational block models compute on (``stages.train.models.typed_model``).
``to_hetero_data`` gives the same batch per type, for code written against ``HeteroData`` (``to_hetero`` models,
``HGTConv``, PyG's ``trim_to_layer``):

- ``data[t].n_id``: the gids of type t in batch order; ``data[t].batch_pos``: their positions in the ``Data``
  batch; ``data[t].x`` when rows are given; ``data[t].num_sampled_nodes`` per hop;
- ``data[(src, rel, dst)].edge_index``: per-type positions (row 0 a src-type node, row 1 a dst-type one), hop by
  hop; ``num_sampled_edges`` per hop;
- ``data[t].batch_size``: the seeds of type t, the first nodes of type t (seeds lead ``n_id``).

Hop order is kept within each type, so a type's nodes within k hops are a prefix of its ``n_id`` and an edge type's
edges of hops 1..k a prefix of its ``edge_index``: the per-layer block layout of the homogeneous batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from storage.schema import GraphSchema


def _per_hop(counts: list[int], member: Tensor) -> list[int]:
    """How many of each hop's entries (``counts`` long runs of ``member``) are members."""
    ends = torch.tensor([0, *counts], device=member.device).cumsum(0)
    csum = torch.cat([member.new_zeros(1, dtype=torch.long), member.long().cumsum(0)])
    at = csum.index_select(0, ends)
    return (at[1:] - at[:-1]).tolist()


def set_types(batch: Data, node_type: Tensor, num_relations: int) -> Data:
    """Mark ``batch`` typed: each node's type and the schema's edge type count, which the blocks read as
    ``batch.num_relations``. Not ``num_edge_types``: PyG's ``Data`` computes that from the batch's own edge types,
    short of any type the batch did not sample."""
    batch.node_type, batch.num_relations = node_type, num_relations
    return batch


def to_hetero_data(batch: Data, schema: GraphSchema, x_dict: Mapping[str, Tensor] | None = None) -> HeteroData:
    """``batch`` (with ``node_type``; ``edge_type`` unless the graph has one edge type) per type (module
    docstring); ``x_dict``: each type's rows in batch order (``NodeLoader.gather_rows``)."""
    node_type = batch.node_type
    split = TypeSplit.of(node_type, batch.edge_index, getattr(batch, "edge_type", None), len(schema.node_types),
                         schema.num_edge_types)
    out = HeteroData()
    for t, nt in enumerate(schema.node_types):
        pos = split.node_pos[t]
        is_t = node_type == t
        store = out[nt.name]
        store.n_id, store.batch_pos, store.num_nodes = batch.n_id.index_select(0, pos), pos, int(pos.numel())
        store.batch_size = int(is_t[:batch.batch_size].sum())
        store.num_sampled_nodes = _per_hop(batch.num_sampled_nodes, is_t)
        if x_dict is not None:
            store.x = x_dict[nt.name]
    for e, et in enumerate(schema.edge_types):
        store = out[et.as_tuple()]
        store.edge_index = split.edge_index[e]
        store.num_sampled_edges = _per_hop(batch.num_sampled_edges, split.edge_type == e)
    return out


@dataclass(frozen=True)
class TypeSplit:
    """A one-layout graph (node type per position, edge type per edge) per type: ``node_pos[t]`` the positions of
    type t's nodes (in order: a type's rows keep the batch's order), ``edge_index[e]`` type e's edges as per-type
    positions (row 0 among the source type's nodes, row 1 among the target type's), ``edge_type`` per edge (zeros
    for a graph of one edge type)."""

    node_pos: list[Tensor]
    edge_index: list[Tensor]
    edge_type: Tensor

    @classmethod
    def of(cls, node_type: Tensor, edge_index: Tensor, edge_type: Tensor | None, num_node_types: int,
           num_edge_types: int) -> TypeSplit:
        if edge_type is None:
            edge_type = torch.zeros(edge_index.shape[1], dtype=torch.long, device=edge_index.device)
        local_pos = torch.empty(node_type.shape, dtype=torch.long, device=node_type.device)   # index within its type
        node_pos = []
        for t in range(num_node_types):
            pos = torch.nonzero(node_type == t).squeeze(1)
            local_pos[pos] = torch.arange(pos.numel(), device=pos.device)
            node_pos.append(pos)
        per_type = []
        for e in range(num_edge_types):
            ei = edge_index.index_select(1, torch.nonzero(edge_type == e).squeeze(1))
            per_type.append(torch.stack([local_pos.index_select(0, ei[0]), local_pos.index_select(0, ei[1])]))
        return cls(node_pos, per_type, edge_type)
