"""What inference runs layer by layer, and the rows its first layer reads (``stages.infer.layerwise``).

A homogeneous model runs as it is, on the features. A typed model (``stages.train.models.typed_model.HeteroModel``)
first maps each node's typed input to ``hidden`` columns (``TypedInput``: a featured type's rows through their linear
map, a featureless type's learnt embedding as it is); that map reads no neighbour, so inference applies it once to the
rank's own nodes, one node type's lid range at a time (partition p's type-t nodes are one range,
``storage.schema.RangeTable``), and runs the body layer-wise on the result as it runs a homogeneous model on its
features. The encoded rows are ``[n_p, hidden]`` float32 (ogbn-mag scale on 2 ranks: 0.97 M x 64 x 4 = 248 MB a rank),
built only when layer 0 asks for them and released after it; the embedding tables of ``model.pt`` (in the dataset's
order of each type) are read for the own rows, a piece at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import FeatureStore, InMemoryFeatureStore, open_part_store
from stages.train.models.typed_model import HeteroModel, TypedInput
from storage import ArtifactError
from storage.features import FeaturesArtifact
from storage.partition import PartitionArtifact

PIECE_ROWS = 1 << 16   # rows encoded at a time: a piece's temporaries stay at a few MB (65 536 x 128 x 4 = 32 MB)


@dataclass
class ModelInput:
    """``model``: what runs layer by layer (the model, or a typed model's body); ``open_rows()``: layer 0's input
    rows of any gid (called once; a rank's feature path, or the typed input of its own nodes)."""

    model: torch.nn.Module
    open_rows: Callable[[], DistFeatures]


def model_input(model: torch.nn.Module, tables: Mapping[str, Tensor], *, partition: PartitionArtifact,
                features: FeaturesArtifact, rank: int, local_world: int, setup: dict[str, Any],
                host_budget: int | None = None) -> ModelInput:
    """The model to run and its input rows for rank ``rank``; ``setup["feature_store"]`` records where the features
    were read from (RAM, or chunk-wise from Zarr past the host's memory budget ``host_budget``: the infer stage's
    ``host_memory_budget_bytes``)."""
    bounds = partition.bounds()
    if not isinstance(model, HeteroModel):
        def features_path() -> DistFeatures:   # no cache: each row is read once per layer-0 chunk that needs it
            store = open_part_store(features, rank, ranks_on_host=local_world, memory_budget_bytes=host_budget)
            setup["feature_store"] = store.kind
            return DistFeatures(store, bounds)
        return ModelInput(model, features_path)

    held = dict(tables)   # the learnt tables are read once, by layer 0: released then

    def encoded() -> DistFeatures:
        rows = encode_own_rows(model.encoder, held, partition=partition, features=features, rank=rank,
                               local_world=local_world, setup=setup, host_budget=host_budget)
        held.clear()
        return DistFeatures(InMemoryFeatureStore(rows), bounds)
    return ModelInput(model.body, encoded)


def encode_own_rows(encoder: TypedInput, tables: Mapping[str, Tensor], *, partition: PartitionArtifact,
                    features: FeaturesArtifact, rank: int, local_world: int, setup: dict[str, Any],
                    host_budget: int | None = None) -> Tensor:
    """``[n_p, hidden]`` float32: the typed input of every own node of rank ``rank``, in lid order."""
    book = partition.book()
    table, offsets = book.range_table(), partition.schema.orig_offsets()
    lo, hi = (int(g) for g in table.bounds[rank:rank + 2])
    out = torch.empty((hi - lo, encoder.hidden), dtype=torch.float32)
    kinds = set()
    for t, name in enumerate(encoder.type_names):
        start, stop = table.type_range(rank, t)
        if name in encoder.lins:
            store = open_part_store(features, rank, name, ranks_on_host=local_world, memory_budget_bytes=host_budget)
            kinds.add(store.kind)
            read = _store_reader(store)
        else:
            emb = _table(tables, name, int(offsets[t + 1] - offsets[t]))
            read = _table_reader(emb, torch.from_numpy(book.type_ids_by_tgid(t, int(offsets[t]), part=rank)))
        for a in range(0, stop - start, PIECE_ROWS):
            b = min(a + PIECE_ROWS, stop - start)
            out[start - lo + a:start - lo + b] = encoder.encode(name, read(a, b)).to(torch.float32)
    setup["feature_store"] = ",".join(sorted(kinds)) or "none"
    return out


Reader = Callable[[int, int], Tensor]   # (first tlid, end tlid) -> a node type's input rows of the rank


def _store_reader(store: FeatureStore) -> Reader:
    def read(a: int, b: int) -> Tensor:
        return store.codec.decode(store.gather(torch.arange(a, b, dtype=torch.long)))
    return read


def _table_reader(table: Tensor, type_id: Tensor) -> Reader:
    """Rows of ``model.pt``'s table (in the dataset's order of the type) of the rank's tlids, whose ids within the
    type are ``type_id``."""
    def read(a: int, b: int) -> Tensor:
        return table.index_select(0, type_id[a:b])
    return read


def _table(tables: Mapping[str, Tensor], name: str, rows: int) -> Tensor:
    table = tables.get(name)
    if table is None or table.shape[0] != rows:
        got = "none" if table is None else f"{table.shape[0]:,} rows"
        raise ArtifactError(f"model.pt holds {got} of node type '{name}''s learnt embeddings where the graph has "
                            f"{rows:,}: the train artifact does not match this partition; rerun the train stage")
    return table
