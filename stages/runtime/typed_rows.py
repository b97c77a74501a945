"""A typed batch's input rows: per featured node type its feature exchange, per featureless type its embedding.

ID spaces (docs/design.md §4): ``gid`` global, ordered by (part, node type, orig); part p's type-t nodes are
the gids ``[type_bounds[p*T + t], type_bounds[p*T + t + 1])``; a type's **tgid** numbers its nodes across parts,
part by part (part p's come after those of parts < p), so each type is one gid space of its own, split by
``type_tgid_bounds[t]`` ([P + 1]) as a homogeneous graph is split by ``bounds``. A featured type's store holds its
rows by ``tlid = tgid - type_tgid_bounds[t][p]``, so the homogeneous feature exchange (``DistFeatures``, with its
cache) serves each type unchanged, and a featureless type is a ``ShardedEmbedding`` over its tgids.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from stages.runtime.dist_features import DistFeatures, FeatureCounters
from stages.runtime.sharded_embedding import ShardedEmbedding
from storage.schema import RangeTable

RowSource = DistFeatures | ShardedEmbedding


class TypeIndex:
    """gid -> (node type, tgid), with ``searchsorted`` on the range table's bounds (tensors on ``device``)."""

    def __init__(self, table: RangeTable, device: torch.device | str = "cpu") -> None:
        self.num_types = table.num_types
        self.num_parts = table.num_parts
        counts = np.diff(table.type_bounds).reshape(self.num_parts, self.num_types)
        tgid_bounds = np.vstack([np.zeros((1, self.num_types), dtype=np.int64), np.cumsum(counts, 0)])   # [P+1, T]
        self.type_tgid_bounds = [tgid_bounds[:, t].copy() for t in range(self.num_types)]
        # tgid = gid + delta[range of gid]: a range's first tgid minus its first gid
        delta = tgid_bounds[:-1].reshape(-1) - table.type_bounds[:-1]
        self.type_bounds = torch.as_tensor(table.type_bounds, device=device)
        self.delta = torch.as_tensor(delta, device=device)

    def locate(self, gid: Tensor) -> tuple[Tensor, Tensor]:
        """``(node_type, tgid)`` of each gid (int64 tensors)."""
        k = torch.searchsorted(self.type_bounds, gid, right=True) - 1
        return torch.remainder(k, self.num_types), gid + self.delta.index_select(0, k)

    def tgid_to_gid(self, node_type: int, tgid: Tensor) -> Tensor:
        """The inverse of ``locate`` for tgids of one type."""
        bounds = torch.as_tensor(self.type_tgid_bounds[node_type], device=tgid.device)
        part = torch.searchsorted(bounds, tgid, right=True) - 1
        start = self.type_bounds.index_select(0, part * self.num_types + node_type).to(tgid.device)
        return tgid - bounds.index_select(0, part) + start


class TypedRows:
    """``gather(n_id)``: the batch's node types and a dict ``{type name: float32 rows}`` of each type's nodes in batch
    order (a featured type's decoded from its storage dtype, ``DistFeatures.decode``).

    Every type's source is asked on every call, also for no row: each is a collective (lockstep)."""

    def __init__(self, index: TypeIndex, type_names: tuple[str, ...], sources: Mapping[str, RowSource]) -> None:
        if set(sources) != set(type_names):
            raise ValueError(f"row sources for {sorted(sources)}, node types {sorted(type_names)}")
        self.index, self.type_names, self.sources = index, type_names, dict(sources)

    @property
    def features(self) -> dict[str, DistFeatures]:
        return {t: s for t, s in self.sources.items() if isinstance(s, DistFeatures)}

    @property
    def embeddings(self) -> dict[str, ShardedEmbedding]:
        return {t: s for t, s in self.sources.items() if isinstance(s, ShardedEmbedding)}

    def gather(self, n_id: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        node_type, tgid = self.index.locate(n_id)
        rows: dict[str, Tensor] = {}
        for t, name in enumerate(self.type_names):
            pos = torch.nonzero(node_type == t).squeeze(1)
            source = self.sources[name]
            got = source.gather(tgid.index_select(0, pos))
            rows[name] = source.decode(got) if isinstance(source, DistFeatures) else got
        return node_type, rows

    def step_embeddings(self) -> None:
        """After a training batch's backward: every embedding's sparse step (collectives, on every rank)."""
        for emb in self.embeddings.values():
            emb.step()

    def discard_gradients(self) -> None:
        for emb in self.embeddings.values():
            emb.discard()

    def reset_counters(self) -> FeatureCounters:
        """The featured types' counters summed (an epoch's feature traffic); counting restarts."""
        total = FeatureCounters()
        for features in self.features.values():
            total = total + features.reset_counters()
        return total
