"""How many bytes a rank's device cache may hold, and where its graph lives, decided where the rank runs (issue
[4/5] items 1 and 7).

- A CUDA rank fills its device: the free device memory (read once the rank's CSR is on it), less a margin, less what
  the model, its optimiser and the largest batch will need (``reserve_bytes``, an estimate stated below), less what
  the rank places there itself (``DeviceShare.beside_bytes``), split between the ranks sharing the card; each
  cached row costs its index's 8 bytes besides its own. On one H100
  a products-sized graph's features (0.96 GB) then sit wholly in HBM, which took a products epoch from 36.5 to 25.7
  ms a batch (benchmarks/RESULTS.md "[4/5] The GPU check on an H100"), with no flag.
- A CPU rank keeps the hotness plan's size (``None``): its "device" cache sits in the RAM its store already uses.
- ``device_cache_bytes`` and ``device_cache_ratio`` (train's, runtime) cap either, when set: a GPU rank's fill, or
  a CPU rank's plan (never raising it: a config written for a GPU's large cap does not copy a CPU rank's whole
  graph into its RAM). (The hotness stage's
  ``cache_ratio`` and ``cache_budget_bytes`` size its plan, which its report evaluates, and a CPU rank's cache.)
- The CSR is placed first (``graph_placement``): in device memory when it fits the same budget, else in pinned host
  memory that the GPU samples through UVA; the cache's budget is then read with the CSR already on the device.

The budget is runtime, not part of any key: another GPU changes the cache, not the hotness plan, whose ranking the
cache takes its first rows from (``cache_policy.cache_gids``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from stages.runtime.sampling.fanouts import graph_fanouts, sampled_nodes_bound
from stages.train.params import Params
from stages.train.tasks import task_def
from storage.partition import PartitionArtifact

# the share of free device memory the cache may take before the reserve: the rest absorbs the allocator's rounding
# and fragmentation, which on a long run can hold several % of what was freed
FREE_MARGIN = 0.9
# CUDA context extras, cuBLAS/cuSPARSE workspaces and collective buffers: measured nowhere yet, set generously
FIXED_RESERVE_BYTES = 1 << 30
# float32 values kept per sampled node per layer while a batch trains: its activations, their gradients and one
# temporary (the aggregation's); GAT-like models keep more per head, which the margin and fixed reserve cover
VALUES_PER_NODE_LAYER = 3
# the cache's own index beside each cached row: its int64 gid (FeatureCache.gid_sorted); for 16 int8 columns that
# is half again the row's bytes, so a fill counts it
CACHE_INDEX_BYTES_PER_ROW = 8
# a prefetched batch's sampled edges beside its float32 input rows: two int64 an edge, about one edge a node of the
# bound where the graph does not cap it (each hop draws an edge a node: products at most 938 k edges, its bound 938 k
# nodes); where it does, the margin and the fixed reserve take the rest
EDGE_INDEX_BYTES_PER_NODE = 16


@dataclass(frozen=True)
class DeviceShare:
    """What else holds this rank's GPU beside its CSR, cache, model and batch: ``ranks`` sharing the card
    (``ranks_sharing_gpu``), ``beside_bytes`` the rank places there itself (``rank_data.beside_cache_bytes``:
    learnt embeddings with their optimiser state, edge feature rows, link positives), ``graphed``, whether its
    step may be a captured CUDA graph, which holds a second batch (``held_batches``), and ``prefetched``, the
    batches its producer prepares ahead (``Params.prefetch_depth``), each holding its input rows and edges."""

    ranks: int = 1
    beside_bytes: int = 0
    graphed: bool = False
    prefetched: int = 0


@dataclass(frozen=True)
class CacheBudget:
    """``bytes``: the cache's budget, or None for the hotness plan's own size; ``fills``: True when the cache takes
    as much of the policy's ranking as ``bytes`` holds (a GPU rank), False when ``bytes`` only caps the plan's own
    rows (a CPU rank: a cap never makes its cache larger than the plan); ``index_bytes``: what each cached row's
    index costs against ``bytes`` (the device's free memory holds it too; a cap's figure is the rows' own bytes,
    as the report's ``cache_bytes``, so 0); ``why``: how it was decided (the ranks' table in the train report)."""

    bytes: int | None
    why: str
    fills: bool = True
    index_bytes: int = 0

    def slot_bytes(self, row_bytes: int) -> int:
        """What one cached row of ``row_bytes`` costs against ``bytes`` (a learnt type's 0-byte rows: nothing)."""
        return row_bytes + (self.index_bytes if row_bytes else 0)


def largest_batch_nodes(params: Params, partition: PartitionArtifact) -> int:
    """An upper bound on a batch's sampled nodes (``sampled_nodes_bound``): the task's most seeds a batch
    (``TaskDef.batch_seeds``), of any type they may have (``TaskDef.seed_types``), sampled with the run's fanouts
    per edge type (``edge_fanouts``) on the partition's schema. Repeats make it loose, not wrong: products samples
    650 k distinct nodes a batch of its 938 k."""
    schema, task = partition.schema, task_def(params.task)
    ids = {t.name: i for i, t in enumerate(schema.node_types)}
    return sampled_nodes_bound(task.batch_seeds(params), [ids[name] for name in task.seed_types(partition)],
                               graph_fanouts(params.fanouts, params.edge_fanouts, schema),
                               [(ids[e.src], ids[e.dst]) for e in schema.edge_types],
                               [t.num_nodes for t in schema.node_types])


def input_width(params: Params, node_types: Iterable[str], featured: Mapping[str, int]) -> int:
    """A batch's widest input row, what ``reserve_bytes`` takes as ``in_features``: a featured type's stored columns
    (``featured``: type -> columns), or ``hidden`` for a featureless type's learnt embedding row."""
    return max(featured.get(name, params.hidden) for name in node_types)


def reserve_bytes(params: Params, *, in_features: int, batch_nodes: int, batches: int = 1,
                  prefetched: int = 0) -> int:
    """What the model, Adam, ``batches`` of the largest batch (``batch_nodes`` sampled nodes:
    ``largest_batch_nodes``) and ``prefetched`` batches prepared ahead need beside the cache (an estimate, see the
    constants): 16 bytes per weight (the weight, its gradient, Adam's two moments); per sampled node of a batch in
    training, its float32 input row and ``VALUES_PER_NODE_LAYER`` hidden-wide values per layer; per node of a
    prefetched batch, its input row and ``EDGE_INDEX_BYTES_PER_NODE``; plus ``FIXED_RESERVE_BYTES``."""
    width = max(in_features, params.hidden)
    weights = params.num_layers * 2 * (width + 1) * params.hidden   # a self and a neighbour matrix per layer
    per_node = 4 * (in_features + VALUES_PER_NODE_LAYER * params.hidden * params.num_layers)
    per_prefetched_node = 4 * in_features + EDGE_INDEX_BYTES_PER_NODE
    return (16 * weights + batch_nodes * (batches * per_node + prefetched * per_prefetched_node)
            + FIXED_RESERVE_BYTES)


def held_batches(share: DeviceShare) -> int:
    """Batches' worth of memory the step holds: one, or two where it may be a captured graph (``share.graphed``:
    the settings and the graph allow it, whatever the model then decides): the captured step's activations stay
    in the graph's private pool, apart from the blocks the eager warm-up left in the general cache, beside the
    static input buffer a padded batch is copied into. A products batch is ~9 GB of the estimate at hidden 256,
    which a rank that cannot be graphed (several ranks, a typed graph) keeps for its cache."""
    return 2 if share.graphed else 1


def ranks_sharing_gpu(params: Params, local_world: int) -> int:
    """How many ranks of this host share each GPU: ``ranks_per_gpu``, but never more than the host's ranks (a lone
    rank asked to share has its GPU to itself: NCCL, the whole budget). With an uneven count (3 ranks, 2 a GPU) the
    last GPU's rank still takes its share only: a smaller cache, never an oversubscribed card."""
    return max(1, min(params.ranks_per_gpu, local_world))


def free_device_bytes(device: torch.device) -> int:
    """The device's free memory now (CUDA's own count: other processes' use included)."""
    return int(torch.cuda.mem_get_info(device)[0])


def cache_budget(params: Params, device: torch.device, *, own_feature_bytes: int, in_features: int, batch_nodes: int,
                 share: DeviceShare = DeviceShare(),
                 free_bytes: Callable[[torch.device], int] = free_device_bytes) -> CacheBudget:
    """This rank's cache budget on ``device``; ``own_feature_bytes``: its partition's stored rows (what
    ``device_cache_ratio`` is a fraction of); ``share``: what else holds the GPU; ``free_bytes``: how the free
    device memory is read (tests pass their own)."""
    caps = []
    if params.device_cache_bytes is not None:
        caps.append((params.device_cache_bytes, f"device_cache_bytes {params.device_cache_bytes:,}"))
    if params.device_cache_ratio is not None:
        caps.append((int(params.device_cache_ratio * own_feature_bytes),
                     f"device_cache_ratio {params.device_cache_ratio:g}"))
    cap = min(caps) if caps else None
    if device.type != "cuda":
        if cap is None:
            return CacheBudget(None, "the hotness plan's size (CPU rank)")
        return CacheBudget(cap[0], f"the hotness plan's size, at most {cap[1]} (CPU rank)", fills=False)
    fill, why = device_budget(params, device, in_features=in_features, batch_nodes=batch_nodes, share=share,
                              free_bytes=free_bytes)
    if cap is not None and cap[0] < fill:
        return CacheBudget(*cap)
    return CacheBudget(fill, f"device: {why}", index_bytes=CACHE_INDEX_BYTES_PER_ROW)


def device_budget(params: Params, device: torch.device, *, in_features: int, batch_nodes: int,
                  share: DeviceShare = DeviceShare(),
                  free_bytes: Callable[[torch.device], int] = free_device_bytes) -> tuple[int, str]:
    """What this CUDA rank may still place on its device, and the arithmetic as a phrase: the margin's share of
    the free memory (split between the ranks on the card), less the reserve for the model and the largest batch,
    less what the rank places there itself (``share.beside_bytes``)."""
    free = free_bytes(device)
    reserve = reserve_bytes(params, in_features=in_features, batch_nodes=batch_nodes, batches=held_batches(share),
                            prefetched=share.prefetched)
    # ranks sharing the GPU (ranks_sharing_gpu) each take their share of what they see free; one that reads after
    # another built its cache sees less and takes less: never more than the card holds
    shared = f" / {share.ranks} ranks" if share.ranks > 1 else ""
    held = (" (twice: a CUDA graph's pool)" if share.graphed else "") + \
        (f" and {share.prefetched} prefetched" if share.prefetched else "")
    beside = (f" − {share.beside_bytes / 2**30:.1f} GiB of embeddings, edge rows and link edges"
              if share.beside_bytes else "")
    return (max(0, int(FREE_MARGIN * free / share.ranks) - reserve - share.beside_bytes),
            f"{FREE_MARGIN:g} × {free / 2**30:.1f} GiB free{shared} − {reserve / 2**30:.1f} GiB for the model and "
            f"the largest batch{held}{beside}")


@dataclass(frozen=True)
class GraphPlacementChoice:
    """``mode``: ``cpu`` (a CPU rank), ``device`` (the CSR in device memory) or ``uva`` (in pinned host memory,
    sampled by the device in place); ``why``: how it was decided (the ranks' table)."""

    mode: str
    why: str


def graph_placement(params: Params, device: torch.device, *, csr_bytes: int, in_features: int, batch_nodes: int,
                    share: DeviceShare = DeviceShare(),
                    free_bytes: Callable[[torch.device], int] = free_device_bytes) -> GraphPlacementChoice:
    """Where this rank's CSR (``csr_bytes``) lives (issue [4/5] item 7). It is placed before the cache, which then
    fills what is left: the CSR goes to the device when it fits the device budget, since every sampled edge reads
    it, and otherwise stays in pinned host memory that the GPU reads in place (GLT's ZERO_COPY graph mode), with
    the whole budget left to the features."""
    if device.type != "cuda":
        return GraphPlacementChoice("cpu", "a CPU rank samples its CSR in RAM")
    if params.graph_placement != "auto":
        return GraphPlacementChoice(params.graph_placement, "set by graph_placement")
    fill, why = device_budget(params, device, in_features=in_features, batch_nodes=batch_nodes, share=share,
                              free_bytes=free_bytes)
    size = f"{csr_bytes / 2**30:.2f} GiB of CSR"
    if csr_bytes <= fill:
        return GraphPlacementChoice("device", f"auto: {size} fits the device budget ({why})")
    return GraphPlacementChoice("uva", f"auto: {size} exceeds the device budget ({why}): pinned host memory, "
                                       f"sampled through UVA")
