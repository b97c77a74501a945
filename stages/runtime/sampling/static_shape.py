"""The static shape of a padded batch: the sizes every batch of a pass fits, fixed in advance from the batch size and
the fanouts alone, which a captured CUDA graph needs (its tensors keep their sizes and addresses). The padding of an
eager sampler's batch (``stages.train.rank.static_batch``) and the static-shape sampler
(``stages.runtime.sampling.static_sampler``) both lay their batches out in it.

Hop k samples at most ``fanout_k`` edges per node of level k - 1 (its frontier) and finds at most one new node per
edge, so no batch can exceed the bounds. Level k (the seeds, then each hop's new nodes) gets a reserve of slots
more than it can fill (``StaticShape.fake``), so every level has *fake* nodes: each level's real nodes come first,
then its fake ones; each hop's real edges first, then fake edges between the always-fake reserves of its source and
target levels, spread over them (``FAKE_EDGES_PER_SLOT``). Fake nodes send no edge to a real node, and edges stay
grouped by target, in frontier order: the fake edges of hop k point past every real target of level k - 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["FAKE_EDGES_PER_SLOT", "StaticShape"]


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
