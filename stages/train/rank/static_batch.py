"""A sampled batch padded to shapes fixed in advance, which a captured CUDA graph of the training step needs
(``stages.train.rank.graphed``): every batch of a pass then has the same tensor sizes.

The bounds follow from the batch size and the fanouts alone (``StaticShape.bound``): hop k samples at most
``fanout_k`` edges per node of level k - 1 (its frontier) and finds at most one new node per edge, so no batch
can exceed them and one graph serves the whole pass. Level k (the seeds, then each hop's new nodes) gets a reserve
of slots more than it can fill (``StaticShape.fake``), so every level has *fake* nodes. A products batch (SAGE
3x256, [15, 10, 5], batch 1024, about 653 k nodes and 850 k edges) pads to 945 k nodes and 937 k edges: the
layers' GEMMs see +12 % rows (their targets, the first three levels: 174 k instead of 155 k) and the sparse
products +10 % edges.

The padded batch is a valid batch of its own: each level's real nodes first, then its fake ones; each hop's real
edges first, then fake edges between the always-fake reserves of its source and target levels, spread over them
(``FAKE_EDGES_PER_SLOT``). Fake nodes send no edge to a real node, so every real node's output, and so the loss
and its gradients, equal the unpadded batch's (up to the order of additions; tested). The fake seeds' labels
are ``IGNORE_LABEL``, which cross-entropy leaves out of its mean. Edges stay grouped by target, in frontier order:
the fake edges of hop k point past every real target of level k - 1.

Only the real nodes' rows are gathered (the feature counters see the batch as it is); ``pad_pos`` says where
each goes among the padded rows. A fake node's input row is whatever the static buffer held (zeros at first, then
a row of an earlier batch): finite, and read by no real node.

ID spaces: ``*_pos`` positions in a batch's ``n_id``; ``pad_pos[real_pos]`` is the padded position of the
unpadded batch's ``real_pos``. ``n_id`` (gids) stays the unpadded batch's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.segments import steps_of

__all__ = ["FAKE_EDGES_PER_SLOT", "IGNORE_LABEL", "StaticShape", "pad_batch", "pad_labels"]

IGNORE_LABEL = -100   # torch's cross_entropy ignore_index default: a fake seed's label counts in no mean

# attributes a padded batch cannot carry yet (their rows would need padding too): the step is not graphed then
_UNPADDED = ("deg", "edge_type", "e_id", "edge_attr", "node_type")


# the fake edges of a hop spread over a reserve of fake slots at its source and target levels, at most this many
# on one slot: GPU sparse products split work by row, and one row holding every fake edge of a hop (products: ~73 k;
# 585 k on a denser test graph) would run as one long serial tail in the forward product and in the backward's
# transposed one. Real rows hold up to a fanout (15); products reserves 60, 600, 3 000 and 3 000 slots (+0.7 %)
FAKE_EDGES_PER_SLOT = 256


@dataclass(frozen=True)
class StaticShape:
    """A padded batch's sizes: ``nodes[k]`` slots for level k (the seeds, then hop k's new nodes), the last
    ``fake[k]`` of them always fake; ``edges[k]`` for hop k + 1's edges."""

    nodes: tuple[int, ...]
    edges: tuple[int, ...]
    fake: tuple[int, ...]

    @classmethod
    def bound(cls, batch_size: int, fanouts: Sequence[Any], num_nodes: int) -> StaticShape:
        """The smallest sizes every batch of ``batch_size`` seeds fits, plus a reserve of fake slots per level
        (module docstring, ``FAKE_EDGES_PER_SLOT``). ``fanouts``: a positive count per hop (``-1``, all
        neighbours, or a count per edge type: ValueError)."""
        if any(not isinstance(f, int) or f <= 0 for f in fanouts):
            raise ValueError(f"static shapes need a positive fanout per hop, got {list(fanouts)}")
        level, nodes, edges = batch_size, [batch_size], []
        for fanout in fanouts:
            edges.append(fanout * level)
            level = min(fanout * level, num_nodes)   # one new node per edge at most, and no more than the graph
            nodes.append(level)
        # level k is the target level of hop k + 1 and the source level of hop k: a reserve for the larger
        touching = [max(edges[k] if k < len(edges) else 0, edges[k - 1] if k else 0) for k in range(len(nodes))]
        fake = tuple(max(1, -(-e // FAKE_EDGES_PER_SLOT)) for e in touching)
        return cls(nodes=tuple(n + f for n, f in zip(nodes, fake)), edges=tuple(edges), fake=fake)

    @property
    def num_nodes(self) -> int:
        return sum(self.nodes)

    @property
    def num_edges(self) -> int:
        return sum(self.edges)

    def fake_edge_index(self, device: torch.device) -> Tensor:
        """``[2, num_edges]``: every slot a fake edge of its hop, from the source level's reserve to the target
        level's, spread evenly and in non-decreasing target order; ``pad_batch`` writes the real edges over the
        first slots of each hop, so what stays fake is a suffix, still after every real target."""
        level_end = list(itertools.accumulate(self.nodes))
        hops = []
        slot = [torch.arange(e, device=device) for e in self.edges]
        for h, e in enumerate(self.edges):   # hop h + 1: targets in level h, sources in level h + 1
            src, dst = (torch.div(slot[h] * self.fake[k], max(e, 1), rounding_mode="floor") + level_end[k] -
                        self.fake[k] for k in (h + 1, h))
            hops.append(torch.stack([src, dst]))
        return torch.cat(hops, dim=1)


def pad_batch(batch: Data, shape: StaticShape, fake_edges: Tensor) -> Data:
    """``batch`` (a sampler's, its hops grouped by target) padded to ``shape`` (module docstring);
    ``fake_edges``: ``shape.fake_edge_index`` on the batch's device, made once. The result keeps the batch's
    ``n_id`` and also carries ``pad_pos`` (module docstring), ``real_batch_size`` and ``real_edges``. Raises
    ``ValueError`` for a batch that does not fit or carries what the padding does not cover."""
    carried = [name for name in _UNPADDED if getattr(batch, name, None) is not None]
    if carried:
        raise ValueError(f"a padded batch cannot carry {', '.join(carried)}")
    if not getattr(batch, "edges_by_target", False):
        raise ValueError("only a batch whose edges come grouped by target (one CSR's sampler) can be padded")
    nodes, edges = list(batch.num_sampled_nodes), list(batch.num_sampled_edges)
    if len(nodes) != len(shape.nodes) or len(edges) != len(shape.edges) or \
            any(n > p - f for n, p, f in zip(nodes, shape.nodes, shape.fake)) or \
            any(e > p for e, p in zip(edges, shape.edges)):
        raise ValueError(f"a batch of {nodes} nodes and {edges} edges per level does not fit the static shape "
                         f"{list(shape.nodes)} / {list(shape.edges)} ({list(shape.fake)} fake nodes per level)")
    device = batch.n_id.device
    pad_start = [0, *itertools.accumulate(shape.nodes)]
    # each level's real nodes first in its padded run: views of one kept arange, one op (no copy from the host,
    # which would stop the producer's stream on a GPU)
    pad_pos = torch.cat([steps_of(start, start + n, device) for start, n in zip(pad_start, nodes)])
    edge_index = fake_edges.clone()
    real_edges = pad_pos.index_select(0, batch.edge_index.reshape(-1)).view(2, -1)
    real_lo, pad_lo = 0, 0
    for e, e_pad in zip(edges, shape.edges):
        edge_index[:, pad_lo:pad_lo + e].copy_(real_edges[:, real_lo:real_lo + e])
        real_lo, pad_lo = real_lo + e, pad_lo + e_pad
    return Data(edge_index=edge_index, n_id=batch.n_id, pad_pos=pad_pos, batch_size=shape.nodes[0],
                num_nodes=shape.num_nodes, num_sampled_nodes=list(shape.nodes), num_sampled_edges=list(shape.edges),
                edges_by_target=True, real_batch_size=int(batch.batch_size), real_edges=sum(edges))


def pad_labels(y: Tensor, size: int) -> Tensor:
    """The seeds' labels ``y`` then ``IGNORE_LABEL`` up to ``size`` (the padded level 0)."""
    out = torch.full((size,), IGNORE_LABEL, dtype=y.dtype, device=y.device)
    out[:y.numel()].copy_(y)
    return out
