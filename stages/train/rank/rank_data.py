"""What one training rank holds of the graph: its partition, opened from the job spec's artifacts.

Rank r (one rank per partition) holds partition r: the CSR of its nodes' incoming edges, its feature store with
the device cache its cache policy picks (policy ``stages.train.rank.cache_policy``, mechanism ``stages.runtime``), its
labels and its split nodes. ``RankData`` is the only place a rank reads artifacts (through the typed handles of
``storage``; ``cache_gids`` reads the cache plan through the same handles): ``open`` at the start, and
``in_dataset_order`` at the end for the published embedding tables; the entry point only wires things together.

ID spaces: ``gid`` global; ``lid = gid - lo`` local to this rank's partition, ``lo = bounds[rank]``; edges: ``egid``
global, ``elid = egid - edge_bounds[rank]`` a position in this rank's CSR ``indices`` (``storage.partition``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures, HostGatherError
from stages.runtime.feature_store import InMemoryFeatureStore, open_part_store
from stages.runtime.sampling.fanouts import graph_fanouts
from stages.runtime.typed_rows import TypedRows
from stages.runtime.uva import UvaUnavailableError
from stages.train.models.encoder import encoder_edge_dim
from stages.train.params import Params
from stages.train.rank.cache_budget import (
    DeviceShare,
    GraphPlacementChoice,
    cache_budget,
    graph_placement,
    input_width,
    largest_batch_nodes,
    ranks_sharing_gpu,
)
from stages.train.rank.cache_policy import cache_gids, resolve_policy, rows_within
from stages.train.rank.graphed import why_not_graphed_setup
from stages.train.rank.typed_data import RowSources, embeddings_in_dataset_order, open_typed_rows
from stages.train.spec import TrainSpec, check_lineage, check_world_size
from storage import ArtifactStore, InputError
from storage.features import FeaturesArtifact
from storage.graph import SPLITS
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from storage.schema import EdgeType, GraphSchema


@dataclass(frozen=True)
class LinkEdges:
    """A rank's positives of link prediction's edge type: those whose destination it owns."""

    edge_gid: dict[str, Tensor]   # SPLITS -> int64 [2, E] (src, dst) gids, on the device
    edge_type: int                # the split edge type's id in the schema

    @classmethod
    def open(cls, partition: PartitionArtifact, rank: int, device: torch.device) -> LinkEdges | None:
        key = partition.link_edge_type
        if key is None:
            return None
        return cls({s: torch.from_numpy(partition.edge_split(rank, s)).to(device) for s in SPLITS},
                   partition.schema.edge_type_id(EdgeType.from_key(key)))

    @property
    def nbytes(self) -> int:
        return sum(int(e.numel()) * e.element_size() for e in self.edge_gid.values())

    def to(self, device: torch.device) -> LinkEdges:
        return LinkEdges({s: e.to(device) for s, e in self.edge_gid.items()}, self.edge_type)


class EdgeData:
    """A graph's edge features as a rank holds them: its own edges' rows (the edges into its nodes), read on first
    use, so a run whose model ignores them does not hold them. A sampled edge's row travels from the rank that
    sampled it, its owner (``stages.runtime.sampling.dist_sampler``, exchange 6)."""

    def __init__(self, partition: PartitionArtifact, rank: int) -> None:
        self.partition, self.rank = partition, rank
        self.num_features = partition.num_edge_features

    @cached_property
    def own_attr(self) -> Tensor:
        """float32 [e_p, D]: this rank's edges' rows, by elid (CPU; 64 MB for 2 M edges of 8 features). The loader
        moves them to the sampler's device, beside the CSR whose ``indices`` already take 8 bytes an edge there: the
        owner selects the rows of the edges it sampled where it sampled them. No cache of remote edges' rows: they
        ride with the sampler's answers, and edges rarely repeat across batches the way hub nodes do."""
        return torch.from_numpy(self.partition.edge_attr(self.rank)).to(torch.float32)

    @classmethod
    def open(cls, partition: PartitionArtifact, rank: int) -> EdgeData | None:
        """None when the graph has no edge features."""
        return cls(partition, rank) if partition.num_edge_features else None


@dataclass
class RankData:
    rank: int
    world: int
    device: torch.device
    bounds: np.ndarray            # int64 [world + 1]: partition p owns gids [bounds[p], bounds[p + 1])
    csr: LocalCSR                 # incoming edges of this rank's nodes (rows (lid, edge type), neighbours by gid)
    # rows of any gid: device cache -> own store -> remote owners; a typed graph's per node type
    # (``stages.train.rank.typed_data``: a featureless type's learnt embeddings)
    features: DistFeatures | TypedRows
    y_of_lid: Tensor              # int64 labels of this rank's nodes, by lid, on the device
    split_gid: dict[str, Tensor]  # SPLITS -> gids of this rank's nodes in that split, on the device
    num_features: int             # a typed graph: 0 (per type in ``in_channels``)
    num_classes: int
    cache_policy: str             # the policy applied (``auto`` resolved)
    schema: GraphSchema           # the graph's node and edge types (a homogeneous graph: one of each)
    setup: dict[str, Any]         # this rank's row of ``metrics.json["ranks"]``
    degrees: DistFeatures | None = None   # in-degree + 1 of any gid, for models that need it (``degree_path``)
    link: LinkEdges | None = None        # link prediction: this rank's positive edges (a graph split for it)
    in_channels: dict[str, int | None] | None = None   # typed graphs: feature width per node type (None: embedded)
    # the process group of the batches' collectives (sampling, rows, degrees, negatives): a prefetching producer
    # thread's own (``stages.train.rank.prefetch``); None: the default group
    group: dist.ProcessGroup | None = None
    edge_bounds: np.ndarray | None = None   # int64 [world + 1]: partition p owns egids [edge_bounds[p], ...[p + 1])
    edges: EdgeData | None = None           # the graph's edge features (None: it has none)
    # the partition handle ``open`` read, kept for the reads at the end (``in_dataset_order``); a handle reads on
    # demand, so keeping it holds no arrays
    partition: PartitionArtifact | None = None

    @property
    def lo(self) -> int:
        """The first gid of this rank's partition."""
        return int(self.bounds[self.rank])

    def label_of(self, seed_gid: Tensor) -> Tensor:
        """Labels of own nodes ``seed_gid`` (the ``LabelOf`` of ``stages.train.tasks``)."""
        return self.y_of_lid.index_select(0, seed_gid - self.lo)

    def in_dataset_order(self, state: dict[str, Any]) -> dict[str, Any]:
        """``model.pt``'s state with its learnt embedding tables in the dataset's order of each type
        (``embeddings_in_dataset_order``: it reads the partition book), as ``storage.train`` stores them."""
        if self.partition is None:
            raise ValueError("in_dataset_order needs the partition handle RankData.open keeps")
        return embeddings_in_dataset_order(state, self.partition)

    @classmethod
    def open(cls, spec: TrainSpec, rank: int, world: int, local_world: int, device: torch.device,
             group: dist.ProcessGroup | None = None) -> RankData:
        """Read partition ``rank``'s data and build its feature path. A collective (the cache build fetches remote
        rows): every rank of the process group calls it. ``local_world`` ranks share this host's memory budget;
        ``group``: the batches' process group (``RankData.group``)."""
        params = Params(**spec.params)
        store = ArtifactStore(spec.artifacts)
        partition = PartitionArtifact(store, store.load("partition", spec.partition_key))
        features = FeaturesArtifact(store, store.load("features", spec.features_key))
        hotness = HotnessArtifact(store, store.load("hotness", spec.hotness_key))
        check_lineage(partition.manifest, features.manifest, hotness.manifest)
        bounds = partition.bounds()
        check_world_size(world, int(bounds.shape[0]) - 1)
        lo = int(bounds[rank])
        edge_bounds = partition.edge_bounds()
        csr = LocalCSR.from_part(partition.csr(rank, native=True), "cpu", start_egid=int(edge_bounds[rank]))
        edges = EdgeData.open(partition, rank)
        if params.edge_weight is not None and edges is not None:   # the stage checked the column exists
            csr = weighted_csr(csr, edges.own_attr[:, params.edge_weight], params.edge_weight)
        widest = input_width(params, (t.name for t in partition.schema.node_types),
                             {name: features.num_features_of(name) for name in features.featured_types})
        link = LinkEdges.open(partition, rank, torch.device("cpu"))   # on the host first: its bytes join the budget
        share = DeviceShare(ranks_sharing_gpu(params, local_world),
                            beside_cache_bytes(params, partition, features, rank, csr, link),
                            graphed=may_be_graphed(params, partition, device, world),
                            prefetched=params.prefetch_depth(device.type, world))
        batch_nodes = largest_batch_nodes(params, partition)   # the CSR's placement and the cache reserve it alike
        csr, placed = place_csr(csr, params, device, in_features=widest, batch_nodes=batch_nodes, share=share)
        part = features.part(rank, load_x=False)
        open_rows = _homogeneous_rows if partition.schema.is_homogeneous else open_typed_rows
        try:
            rows = open_rows(params, partition=partition, features=features, hotness=hotness, rank=rank,
                             local_world=local_world, device=device, group=group, share=share,
                             batch_nodes=batch_nodes)
        except HostGatherError as err:   # the runtime's ValueError for a user's setting: one line (storage/errors.py)
            raise InputError(str(err)) from None
        setup = {"rank": rank, "graph": placed.mode, "graph_placement": placed.why, **rows.setup,
                 **{f"{s}_nodes": int(part.split_lids[s].shape[0]) for s in SPLITS}}
        return cls(rank=rank, world=world, device=device, bounds=bounds, csr=csr, features=rows.rows,
                   degrees=degree_path(csr, bounds, device, group), y_of_lid=torch.from_numpy(part.y).to(device),
                   split_gid={s: torch.from_numpy(part.split_lids[s] + lo).to(device) for s in part.split_lids},
                   num_features=rows.num_features, num_classes=int(part.attrs["num_classes"]),
                   cache_policy=rows.cache_policy, setup=setup, in_channels=rows.in_channels,
                   schema=partition.schema, link=None if link is None else link.to(device), edge_bounds=edge_bounds,
                   edges=edges, group=group, partition=partition)


def may_be_graphed(params: Params, partition: PartitionArtifact, device: torch.device, world: int) -> bool:
    """Whether the rank's step may be a captured CUDA graph as far as the settings and the graph tell before the
    model is built (``graphed.why_not_graphed_setup``): its cache budget then reserves the graph's second batch."""
    typed = not partition.schema.is_homogeneous
    edge_dim = encoder_edge_dim(params, typed=typed, num_edge_features=partition.num_edge_features)
    fanouts = graph_fanouts(params.fanouts, params.edge_fanouts, partition.schema)
    return why_not_graphed_setup(params.cuda_graph, device=device, world=world,
                                 precision=params.rank_precision(device.type),
                                 fanouts=fanouts, typed=typed, edge_features=edge_dim > 0) is None


def beside_cache_bytes(params: Params, partition: PartitionArtifact, features: FeaturesArtifact, rank: int,
                       csr: LocalCSR, link: LinkEdges | None) -> int:
    """What a GPU rank places on its device beside its CSR, cache, model and batch, counted before the cache is
    sized (``cache_budget.DeviceShare``): its link positives; its edges' feature rows, float32, which the loader
    moves over when the run's model reads them (``encoder_edge_dim``); and each featureless node type's learnt
    embedding rows with SparseAdam's two dense moments, 12 bytes x hidden a row (30 GB for 10 M rows at hidden 256:
    left out, such a rank filled its cache and then failed at its first step)."""
    table, featured = partition.range_table(), set(features.featured_types)
    learnt = 0
    for t, node_type in enumerate(partition.schema.node_types):
        if node_type.name not in featured:
            lo, hi = table.type_range(rank, t)
            learnt += hi - lo
    edge_dim = encoder_edge_dim(params, typed=not partition.schema.is_homogeneous,
                                num_edge_features=partition.num_edge_features)
    edge_rows = int(csr.indices.numel()) * partition.num_edge_features * 4 if edge_dim > 0 else 0
    return (0 if link is None else link.nbytes) + edge_rows + learnt * params.hidden * 4 * 3


def place_csr(csr: LocalCSR, params: Params, device: torch.device, *, in_features: int, batch_nodes: int,
              share: DeviceShare = DeviceShare()) -> tuple[LocalCSR, GraphPlacementChoice]:
    """``csr`` (on the CPU) where ``graph_placement`` puts it: the device's memory, or pinned host memory the device
    samples in place (where UVA is unavailable, an auto choice falls back to device memory, saying so)."""
    placed = graph_placement(params, device, csr_bytes=csr.nbytes, in_features=in_features, batch_nodes=batch_nodes,
                             share=share)
    if placed.mode != "uva":
        return csr.to_device(device), placed
    try:
        return csr.pinned_on(device), placed
    except UvaUnavailableError as err:
        if params.graph_placement == "uva":
            raise InputError(f"graph_placement=uva: {err}; set graph_placement=device or auto") from None
        try:   # the budget keeps a margin and a reserve: the CSR may still fit, leaving the cache less
            return csr.to_device(device), GraphPlacementChoice("device", f"{placed.why}, but UVA is unavailable "
                                                                         f"({err})")
        except torch.OutOfMemoryError:
            raise InputError(f"graph_placement=auto: this rank's {csr.nbytes / 2**30:.2f} GiB of CSR exceed its "
                             f"device budget, UVA is unavailable ({err}) and device memory cannot hold it: "
                             f"partition the graph into more parts (num_partitions)") from None


def weighted_csr(csr: LocalCSR, weight: Tensor, column: int) -> LocalCSR:
    """``csr`` sampling in proportion to ``weight`` (its edges' ``edge_weight`` column; the owner of an edge samples
    it, so no weight travels); one error line when a weight is negative or not finite."""
    try:
        return csr.with_edge_weight(weight)
    except ValueError:
        bad = int(torch.nonzero(~torch.isfinite(weight) | (weight < 0))[0, 0])
        raise InputError(f"edge_weight={column}: edge feature column {column} holds {float(weight[bad])} (edge "
                         f"egid {csr.start_egid + bad}); sampling weights must be finite and >= 0: pick another "
                         f"column or fix the edge features") from None


def _homogeneous_rows(params: Params, *, partition: PartitionArtifact, features: FeaturesArtifact,
                      hotness: HotnessArtifact, rank: int, local_world: int, device: torch.device,
                      group: dist.ProcessGroup | None, share: DeviceShare, batch_nodes: int) -> RowSources:
    """One feature store, its exchange (on ``group``) and its device cache. A collective (the cache build)."""
    x_store = open_part_store(features, rank, memory_budget_bytes=params.host_memory_budget_bytes,
                                 ranks_on_host=local_world, pin=device.type == "cuda")
    dist_features = DistFeatures(x_store, partition.bounds(), device=device, group=group,
                                 host_gather=params.host_gather)
    start = time.perf_counter()
    policy = resolve_policy(params.cache_policy, device.type)
    budget = cache_budget(params, device, own_feature_bytes=x_store.num_rows * x_store.row_bytes,
                          in_features=x_store.num_features, batch_nodes=batch_nodes, share=share)
    fit = None if budget.bytes is None else rows_within(budget.bytes // max(budget.slot_bytes(x_store.row_bytes), 1))
    cached_gid = cache_gids(policy, partition=partition, hotness=hotness, rank=rank, fit=fit,   # reads the plan
                            fills=budget.fills)
    cache = dist_features.build_cache(torch.from_numpy(cached_gid))
    setup = {"feature_store": x_store.kind, "host_gather": dist_features.host_gather_mode,
             "host_gather_why": dist_features.host_gather_why,
             "cache_rows": cache.num_rows, "cache_bytes": cache.nbytes, "cache_budget": budget.why,
             "cache_build_s": round(time.perf_counter() - start, 3)}
    return RowSources(dist_features, x_store.num_features, None, policy, setup)


def degree_path(csr: LocalCSR, bounds: np.ndarray, device: torch.device,
                group: dist.ProcessGroup | None = None) -> DistFeatures:
    """Every gid's true in-degree + 1 (GCN's normalisation, ``stages.train.models.blocks``) as a 1-column feature path.

    Each rank holds only its own nodes' degrees (one float32 per lid: 4.8 MB for 1.2 M nodes), read off its CSR;
    a batch's remote degrees come from their owners through the feature exchange (``DistFeatures.gather``: 4 bytes
    of gid out and 4 back per remote node, ~2 % of a 100-float32 feature row). No cache: one exchange per batch.
    """
    node_indptr = csr.indptr[::csr.num_edge_types]   # a node's rows of every edge type are one range
    deg_of_lid = (torch.diff(node_indptr) + 1).to(device="cpu", dtype=torch.float32)
    return DistFeatures(InMemoryFeatureStore(deg_of_lid[:, None]), bounds, device=device, group=group)
