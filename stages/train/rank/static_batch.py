"""A sampled batch padded to shapes fixed in advance, which a captured CUDA graph of the training step needs
(``stages.train.rank.graphed``): every batch of a pass then has the same tensor sizes.

The shape (``stages.runtime.sampling.static_shape``) bounds every batch of a pass, so one graph serves them all. A
products batch (SAGE 3x256, [15, 10, 5], batch 1024, about 653 k nodes and 850 k edges) pads to 945 k nodes and 937 k
edges: the layers' GEMMs see +12 % rows (their targets, the first three levels: 174 k instead of 155 k) and the
sparse products +10 % edges.

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

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.sampling.static_shape import StaticShape
from stages.runtime.segments import steps_of

__all__ = ["IGNORE_LABEL", "pad_batch", "pad_labels"]

IGNORE_LABEL = -100   # torch's cross_entropy ignore_index default: a fake seed's label counts in no mean

# attributes a padded batch cannot carry yet (their rows would need padding too): the step is not graphed then
_UNPADDED = ("deg", "edge_type", "e_id", "edge_attr", "node_type")


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
