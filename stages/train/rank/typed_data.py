"""What one training rank holds of a typed graph: ``RankData`` with a row source per node type.

A featured type's rows come through its own feature exchange and device cache (``DistFeatures`` over the type's
tgids, ``stages.runtime.typed_rows``); a featureless type's are learnt ``ShardedEmbedding`` rows, ``hidden`` wide
(the typed input passes them to the first layer as they are). The cache plan is one list of gids across types
(the hotness stage fits it to one byte budget): each type's cache gets the plan's gids of that type.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_codec import FeatureCodec
from stages.runtime.feature_store import fit_in_budget, host_budget, open_feature_store, x_nbytes
from stages.runtime.sharded_embedding import ShardedEmbedding
from stages.runtime.typed_rows import RowSource, TypedRows, TypeIndex
from stages.train.params import Params
from stages.train.rank.cache_budget import CacheBudget, DeviceShare, cache_budget, input_width
from stages.train.rank.cache_policy import Fit, bytes_within, cache_gids, resolve_policy
from storage.features import FeaturesArtifact
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from storage.train import EMBEDDING_PREFIX


@dataclass
class RowSources:
    """Where a rank's input rows come from (``RankData.features``) and what the rank reports about them."""

    rows: DistFeatures | TypedRows
    num_features: int                           # a typed graph: 0 (per type in ``in_channels``)
    in_channels: dict[str, int | None] | None   # typed: feature width per node type; None: a learnt embedding
    cache_policy: str                           # ``auto`` resolved
    setup: dict[str, Any]                       # the rank's entries of ``metrics.json["ranks"]``


def open_typed_rows(params: Params, *, partition: PartitionArtifact, features: FeaturesArtifact,
                    hotness: HotnessArtifact, rank: int, local_world: int, device: torch.device,
                    group: dist.ProcessGroup | None, share: DeviceShare, batch_nodes: int) -> RowSources:
    """The row sources of rank ``rank``, exchanging on ``group`` (``RankData.group``; the embeddings' sparse step
    stays on the default group, the trainer's main thread's). A collective (each featured type's cache build, in
    schema order). ``batch_nodes``: the largest batch's bound the device budget reserves for
    (``cache_budget.largest_batch_nodes``)."""
    schema = partition.schema
    table = partition.range_table()
    index = TypeIndex(table, device)
    start = time.perf_counter()
    policy = resolve_policy(params.cache_policy, device.type)
    x_of = {name: features.x(rank, name) for name in features.featured_types}
    budget, fit = _typed_budget(params, device, x_of, partition, share, batch_nodes)
    cached_gid = torch.from_numpy(cache_gids(policy, partition=partition, hotness=hotness, rank=rank,
                                             fit=fit, fills=budget.fills)).to(device)
    cached_type, cached_tgid = index.locate(cached_gid)
    # the host budget is the rank's, for all its featured types together (each type had all of it before)
    in_ram = fit_in_budget({name: x_nbytes(x) for name, x in x_of.items()},
                           host_budget(params.host_memory_budget_bytes, local_world))
    sources: dict[str, RowSource] = {}
    types: dict[str, dict[str, Any]] = {}
    for t, node_type in enumerate(schema.node_types):
        name, tgid_bounds = node_type.name, index.type_tgid_bounds[t]
        own_rows = int(tgid_bounds[rank + 1] - tgid_bounds[rank])
        if name in x_of:
            store = open_feature_store(x_of[name], codec=FeatureCodec.of(features.scheme(rank, name)),
                                       memory_budget_bytes=x_nbytes(x_of[name]) if name in in_ram else 0,
                                       pin=device.type == "cuda")
            # a type left in Zarr (past the budget) has no pinned rows to read in place: auto copies them, and
            # uva asked for by name fails in one line, as on a homogeneous graph (DistFeatures)
            rows = DistFeatures(store, tgid_bounds, device=device, group=group, host_gather=params.host_gather)
            cache = rows.build_cache(cached_tgid[cached_type == t])
            sources[name] = rows
            types[name] = {"rows": own_rows, "feature_store": store.kind, "host_gather": rows.host_gather_mode,
                           "host_gather_why": rows.host_gather_why,
                           "cache_rows": cache.num_rows, "cache_bytes": cache.nbytes}
        else:
            emb = ShardedEmbedding(tgid_bounds, params.hidden, lr=params.embedding_lr, seed=params.seed,
                                   node_type=t, device=device, group=group, step_group=None)
            sources[name] = emb
            types[name] = {"rows": own_rows, "embedding_bytes": own_rows * params.hidden * 4}
    typed_rows = TypedRows(index, tuple(t.name for t in schema.node_types), sources)
    setup = {"feature_store": _joined(types, "feature_store"), "host_gather": _joined(types, "host_gather"),
             "host_gather_why": "; ".join(f"{name}: {v['host_gather_why']}" for name, v in types.items()
                                          if "host_gather_why" in v),
             "cache_rows": sum(v.get("cache_rows", 0) for v in types.values()),
             "cache_bytes": sum(v.get("cache_bytes", 0) for v in types.values()), "cache_budget": budget.why,
             "cache_build_s": round(time.perf_counter() - start, 3), "types": types}
    return RowSources(typed_rows, 0, typed_in_channels(partition, features), policy, setup)


def _typed_budget(params: Params, device: torch.device, x_of: dict[str, Any], partition: PartitionArtifact,
                  share: DeviceShare, batch_nodes: int) -> tuple[CacheBudget, Fit | None]:
    """The rank's cache budget over its featured types' rows (``cache_budget``), and the fit that walks the ranking
    by each gid's own row width (0 for a type whose rows are learnt: no cache holds them)."""
    schema, table = partition.schema, partition.range_table()
    row_bytes = np.array([x_of[t.name].shape[1] * x_of[t.name].dtype.itemsize if t.name in x_of else 0
                          for t in schema.node_types], dtype=np.int64)
    budget = cache_budget(params, device, own_feature_bytes=sum(x_nbytes(x) for x in x_of.values()),
                          in_features=input_width(params, (t.name for t in schema.node_types),
                                                  {name: int(x.shape[1]) for name, x in x_of.items()}),
                          batch_nodes=batch_nodes, share=share)
    if budget.bytes is None:
        return budget, None
    slot_bytes = np.array([budget.slot_bytes(int(b)) for b in row_bytes], dtype=np.int64)
    return budget, bytes_within(budget.bytes, lambda gid: slot_bytes[table.locate(gid)[1]])


def _joined(types: dict[str, dict[str, Any]], key: str) -> str:
    """The featured types' distinct values of ``key``, sorted and comma-joined (the rank's one entry)."""
    return ",".join(sorted({str(v[key]) for v in types.values() if key in v}))


def typed_in_channels(partition: PartitionArtifact, features: FeaturesArtifact) -> dict[str, int | None]:
    """Each node type's input width in schema order: its features', or None for a learnt embedding."""
    featured = set(features.featured_types)
    return {t.name: (features.num_features_of(t.name) if t.name in featured else None)
            for t in partition.schema.node_types}


def embeddings_in_dataset_order(state: dict[str, Any], partition: PartitionArtifact) -> dict[str, Any]:
    """``model.pt``'s embedding tables (``storage.train``) reordered from tgids (how the ranks shard them) to the
    dataset's ids within each type, so that row i of ``embeddings.author`` is author i."""
    book, schema = partition.book(), partition.schema
    offsets = schema.orig_offsets()
    out = dict(state)
    for key in state:
        if key.startswith(EMBEDDING_PREFIX):
            t = schema.type_id(key[len(EMBEDDING_PREFIX):])
            type_id = torch.from_numpy(book.type_ids_by_tgid(t, int(offsets[t])))
            out[key] = torch.empty_like(state[key]).index_copy_(0, type_id, state[key])
    return out
