"""The device cache's runtime budget (stages.train.rank.cache_budget, issue [4/5] item 1): a GPU rank fills its free
memory after a reserve, a CPU rank keeps the hotness plan's size, the train caps bound both; the cache takes that
many rows of the policy's ranking, which past the pre-sampled rows goes on by in-degree to every row. The GPU's
side is read through an injected ``free_bytes`` here; tests/test_gpu_train.py runs it on a device."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stages.hotness.plan import degree_order
from stages.train.params import Params
from stages.train.rank.cache_budget import (
    CACHE_INDEX_BYTES_PER_ROW,
    FIXED_RESERVE_BYTES,
    FREE_MARGIN,
    CacheBudget,
    DeviceShare,
    GraphPlacementChoice,
    cache_budget,
    graph_placement,
    input_width,
    largest_batch_nodes,
    reserve_bytes,
)
from stages.train.rank.cache_policy import bytes_within, cache_gids, full_ranking, rows_within
from storage import ArtifactStore
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from storage.schema import EdgeType, GraphSchema, NodeType
from tests._train_pipeline import build_upstream

GPU, CPU = torch.device("cuda", 0), torch.device("cpu")   # a device object needs no device
GiB = 2**30


def one_type(num_nodes: int) -> SimpleNamespace:
    """What ``largest_batch_nodes`` reads of a partition of a one-type graph (link's split on its one edge type)."""
    return SimpleNamespace(schema=GraphSchema.homogeneous(num_nodes, 8, 3), link_edge_type="node___edge___node")


BATCH = 1024 * (1 + 15 + 15 * 10 + 15 * 10 * 5)   # the default recipe's batch bound on a graph of over 937 984 nodes


def test_the_largest_batch_is_bounded_by_the_fanouts_and_the_graph():
    p = Params(batch_size=4, fanouts=(2, 3))
    assert largest_batch_nodes(p, one_type(1000)) == 4 + 8 + 24
    assert largest_batch_nodes(p, one_type(20)) == 20
    assert largest_batch_nodes(Params(batch_size=4, fanouts=(2, -1)), one_type(1000)) == 1000   # -1: every neighbour
    # link prediction samples around a positive's two ends and its negatives: (2 + k) B in training, 2B + the
    # shared eval_negatives in evaluation, whichever is more
    link = Params(task="link", batch_size=4, fanouts=(2, 3), num_negatives=3, eval_negatives=5)
    assert largest_batch_nodes(link, one_type(10**6)) == 20 * (1 + 2 + 6)
    assert largest_batch_nodes(link.model_copy(update={"eval_negatives": 50}), one_type(10**6)) == 58 * (1 + 2 + 6)


def test_a_typed_batch_grows_by_each_edge_type_into_a_node():
    """A typed graph's hop draws its fanout on every edge type into a frontier node, so the bound follows the
    types: papers (the labelled seeds) draw cited papers and their authors; authors draw their papers; each type's
    new nodes are capped by its unseen ones. Left to a margin, [2, 3] from 4 seeds bounded 36 nodes, not 95."""
    schema = GraphSchema((NodeType("paper", 10_000, 8, 3), NodeType("author", 50), NodeType("venue", 3)),
                         (EdgeType("paper", "cites", "paper"), EdgeType("author", "writes", "paper"),
                          EdgeType("paper", "rev_writes", "author"), EdgeType("venue", "hosts", "paper")))
    typed = SimpleNamespace(schema=schema, link_edge_type="author___writes___paper")
    p = Params(batch_size=4, fanouts=(2, 3))
    # hop 1 from 4 papers: 8 papers (cites), 8 authors (writes), 3 venues (8 drawn, 3 exist); hop 2: the 8 new
    # papers draw 24 papers, 24 authors and no venue (none unseen), the 8 authors 24 papers, the venues nothing
    assert largest_batch_nodes(p, typed) == 4 + (8 + 8 + 3) + (24 + 24 + 24) == 95
    # no hop from the venues: no edge type ends at one. An edge type's own fanout (0: not sampled) replaces it
    assert largest_batch_nodes(p.model_copy(update={"edge_fanouts": {"hosts": [0, 0]}}), typed) == 4 + 16 + 72
    # task=link: seeds may be authors or papers (the split's two ends; negatives are papers): both counted
    link = Params(task="link", batch_size=1, fanouts=(2,), num_negatives=2, eval_negatives=2)
    from_papers, from_authors = 4 + 8 + 8 + 3, 4 + 8
    assert largest_batch_nodes(link, typed) == from_papers + from_authors
    assert largest_batch_nodes(Params(batch_size=4, fanouts=(2, -1)), typed) == 4 + 19 + 9_988 + 42, \
        "-1: every node of each type drawn from, less its seen ones"


def test_the_widest_input_row_counts_a_learnt_types_hidden_width():
    p = Params(hidden=64)
    assert input_width(p, ["node"], {"node": 100}) == 100
    assert input_width(p, ["paper", "author"], {"paper": 16}) == 64, "author's rows are learnt, hidden wide"
    assert input_width(p, ["paper", "author"], {"paper": 128}) == 128


def test_products_features_fit_one_h100_with_no_flag():
    """ogbn-products on one H100 (79.2 GiB, ~78 free once the CSR is there): its 0.96 GB of float32 rows fit."""
    products = Params()   # SAGE 3 x 256, [15, 10, 5], batch 1024: the recipe
    nodes = largest_batch_nodes(products, one_type(2_449_029))
    assert nodes == 1024 * (1 + 15 + 15 * 10 + 15 * 10 * 5)
    reserve = reserve_bytes(products, in_features=100, batch_nodes=nodes)
    assert reserve == 16 * 3 * 2 * 257 * 256 + nodes * 4 * (100 + 3 * 256 * 3) + FIXED_RESERVE_BYTES
    budget = cache_budget(products, GPU, own_feature_bytes=979_611_600, in_features=100, batch_nodes=nodes,
                          free_bytes=lambda device: 78 * GiB)
    assert budget.bytes == int(FREE_MARGIN * 78 * GiB) - reserve and budget.bytes > 979_611_600
    assert budget.why.startswith("device: 0.9 × 78.0 GiB free")


def test_a_graphed_step_reserves_a_second_batch_only_where_a_step_may_be_graphed():
    """A captured step's pool holds a batch beside the eager warm-up's blocks: the reserve counts the batch twice
    (the weights and the fixed part once), and only for a rank that ``why_not_graphed_setup`` lets be graphed; a
    rank that cannot be (several ranks, a typed graph, cuda_graph=off) keeps that batch for its cache."""
    from stages.train.rank.cache_budget import device_budget
    from stages.train.rank.rank_data import may_be_graphed

    shape = {"in_features": 100, "batch_nodes": largest_batch_nodes(Params(), one_type(2_449_029))}
    eager, batch = reserve_bytes(Params(), **shape), shape["batch_nodes"] * 4 * (100 + 3 * 256 * 3)
    assert reserve_bytes(Params(), **shape, batches=2) == eager + batch and batch > 9e9, "products: ~9 GB"
    free = {"free_bytes": lambda d: 78 * GiB}
    one, graphed = device_budget(Params(), GPU, **shape, **free), \
        device_budget(Params(), GPU, **shape, share=DeviceShare(graphed=True), **free)
    assert one[0] - graphed[0] == batch and "twice: a CUDA graph's pool" in graphed[1] and "twice" not in one[1]
    # a batch prepared ahead (prefetch, 1 by default on a lone GPU rank) holds its float32 rows and its edges
    ahead = device_budget(Params(), GPU, **shape, share=DeviceShare(prefetched=1), **free)
    assert one[0] - ahead[0] == shape["batch_nodes"] * (4 * 100 + 16) and ahead[1].endswith("and 1 prefetched")

    plain = SimpleNamespace(schema=GraphSchema.homogeneous(100, 8, 3), num_edge_features=0)
    assert may_be_graphed(Params(), plain, GPU, 1), "the defaults: cuda_graph=auto, precision=auto (tf32 there)"
    assert may_be_graphed(Params(cuda_graph="step", precision="float32"), plain, GPU, 1)
    typed = GraphSchema((NodeType("paper", 10, 8, 3), NodeType("author", 5)),
                        (EdgeType("author", "writes", "paper"), EdgeType("paper", "cites", "paper")))
    refused = [(Params(cuda_graph="off"), plain, GPU, 1), (Params(cuda_graph="auto"), plain, CPU, 1),
               (Params(cuda_graph="auto"), plain, GPU, 2),
               (Params(cuda_graph="auto", precision="bfloat16"), plain, GPU, 1),
               (Params(cuda_graph="auto", fanouts=(5, -1)), plain, GPU, 1),
               (Params(cuda_graph="auto", model="gat"), SimpleNamespace(schema=plain.schema, num_edge_features=4),
                GPU, 1),
               (Params(cuda_graph="auto"), SimpleNamespace(schema=typed, num_edge_features=0), GPU, 1)]
    for params, partition, device, world in refused:
        assert not may_be_graphed(params, partition, device, world), (params, device, world)


def test_caps_bound_the_device_and_a_cpu_rank_keeps_the_plan():
    def budget(device: torch.device, free: int = 40 * GiB, sharing: int = 1, beside: int = 0,
               **caps: float | int) -> int | None:
        return cache_budget(Params(**caps), device, own_feature_bytes=10 * GiB, in_features=100, batch_nodes=BATCH,
                            share=DeviceShare(sharing, beside), free_bytes=lambda d: free).bytes

    assert budget(CPU) is None, "CPU ranks: the hotness plan's size, as before"
    assert budget(CPU, device_cache_ratio=0.25) == int(0.25 * 10 * GiB)
    assert budget(CPU, device_cache_ratio=0.25, device_cache_bytes=1000) == 1000, "the smaller cap"
    cpu = cache_budget(Params(device_cache_bytes=1000), CPU, own_feature_bytes=10 * GiB, in_features=100,
                       batch_nodes=BATCH)
    assert not cpu.fills and cpu.why == "the hotness plan's size, at most device_cache_bytes 1,000 (CPU rank)"
    assert cache_budget(Params(device_cache_bytes=1000), GPU, own_feature_bytes=10 * GiB, in_features=100,
                        batch_nodes=BATCH, free_bytes=lambda d: 40 * GiB).fills
    assert budget(GPU, device_cache_ratio=0.25) == int(0.25 * 10 * GiB), "a cap below what the device leaves"
    reserve = reserve_bytes(Params(), in_features=100, batch_nodes=BATCH)
    fill = int(FREE_MARGIN * 40 * GiB) - reserve
    assert budget(GPU) == budget(GPU, device_cache_bytes=10**15) == fill, "a cap above it leaves the device's figure"
    assert budget(GPU, device_cache_bytes=fill - 1) == fill - 1 and budget(GPU, device_cache_bytes=fill + 1) == fill
    assert budget(GPU, free=GiB) == 0, "less free than the reserve: no cache, not a negative one"
    assert budget(GPU, sharing=2) == int(FREE_MARGIN * 40 * GiB / 2) - reserve, "ranks sharing a GPU share it"
    assert budget(GPU, sharing=3) == int(FREE_MARGIN * 40 * GiB / 3) - reserve
    assert budget(GPU, sharing=2, beside=GiB) == int(FREE_MARGIN * 40 * GiB / 2) - reserve - GiB, "what else it holds"
    assert budget(GPU, beside=40 * GiB) == 0


def test_a_fill_counts_the_cache_index_and_what_else_the_rank_places_on_its_device():
    """A GPU fill pays 8 bytes of index a cached row (a cap counts rows alone); ``beside_cache_bytes`` counts the
    learnt embeddings with SparseAdam's two moments, the edges' feature rows and the link positives."""
    from stages.train.rank.rank_data import LinkEdges, beside_cache_bytes
    from storage.schema import RangeTable

    def of(device: torch.device, **caps: int) -> CacheBudget:
        return cache_budget(Params(**caps), device, own_feature_bytes=10 * GiB, in_features=16, batch_nodes=BATCH,
                            free_bytes=lambda d: 40 * GiB)

    fill = of(GPU)
    assert fill.slot_bytes(16) == 16 + CACHE_INDEX_BYTES_PER_ROW == 24
    assert fill.slot_bytes(0) == 0, "a learnt type's rows are in no cache"
    # a cap is the rows' own bytes, on either device (the report's cache_bytes counts them so)
    assert of(GPU, device_cache_bytes=24_000).slot_bytes(16) == of(CPU, device_cache_bytes=24_000).slot_bytes(16) == 16
    # two parts, three node types: part 1 owns 30 papers (featured), 50 authors and 7 institutions (learnt)
    table = RangeTable.from_counts(np.array([[10, 20, 3], [30, 50, 7]]))
    types = [SimpleNamespace(name=n) for n in ("paper", "author", "institution")]
    partition = SimpleNamespace(range_table=lambda: table, schema=SimpleNamespace(node_types=types,
                                                                                 is_homogeneous=False),
                                num_edge_features=8)
    features = SimpleNamespace(featured_types=("paper",))
    csr = SimpleNamespace(indices=torch.zeros(1000, dtype=torch.long))
    link = LinkEdges({s: torch.zeros(2, n, dtype=torch.long) for s, n in (("train", 40), ("valid", 5),
                                                                        ("test", 5))}, 0)
    learnt = (50 + 7) * 32 * 4 * 3
    got = beside_cache_bytes(Params(hidden=32), partition, features, 1, csr, link)
    assert got == 2 * 50 * 8 + learnt, "no typed built-in reads the edges' rows: they stay on the host"
    # one node type, featured: GAT reads the edges' 8 float32 columns, which the loader then moves to the device
    one = SimpleNamespace(range_table=lambda: RangeTable.from_counts(np.array([[10], [30]])), num_edge_features=8,
                          schema=SimpleNamespace(node_types=types[:1], is_homogeneous=True))
    assert beside_cache_bytes(Params(model="gat"), one, features, 1, csr, None) == 1000 * 8 * 4
    assert beside_cache_bytes(Params(model="sage"), one, features, 1, csr, None) == 0
    assert beside_cache_bytes(Params(hidden=32), SimpleNamespace(**{**vars(partition), "num_edge_features": 0}),
                              SimpleNamespace(featured_types=("paper", "author", "institution")), 1, csr, None) == 0


def test_bytes_within_walks_rows_of_several_widths():
    widths = np.array([400, 0, 100])   # three node types; the second's rows are learnt: no cache holds them
    type_of = np.array([0, 1, 2, 0, 2, 1, 0])
    fit = bytes_within(1000, lambda gid: widths[type_of[gid]])
    assert fit(np.arange(7)) == 6      # 400 + 0 + 100 + 400 + 100 = 1000, then gid 5's 0 bytes; gid 6's 400 do not
    assert fit(np.array([0, 3, 6])) == 2
    assert rows_within(3)(np.arange(7)) == 3 and rows_within(30)(np.arange(7)) == 7


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> tuple[PartitionArtifact, HotnessArtifact]:
    store = ArtifactStore(tmp_path_factory.mktemp("cache-budget") / "art")
    manifests = build_upstream(store, 2)
    return (PartitionArtifact(store, manifests["partition"]), HotnessArtifact(store, manifests["hotness"]))


def test_a_budget_takes_the_rankings_first_rows_and_all_of_them_at_most(artifacts):
    partition, hotness = artifacts
    plan = hotness.plan(0)
    num_nodes = int(partition.bounds()[-1])
    as_planned = cache_gids("hotness", partition=partition, hotness=hotness, rank=0)
    assert np.array_equal(as_planned, plan.plan_gid), "no budget: the plan, as before"
    m = int(plan.plan_gid.shape[0])
    same = cache_gids("hotness", partition=partition, hotness=hotness, rank=0, fit=rows_within(m))
    assert np.array_equal(same, plan.plan_gid), "the plan is the ranking's first rows"
    every = cache_gids("hotness", partition=partition, hotness=hotness, rank=0, fit=rows_within(10 * num_nodes))
    assert np.array_equal(np.sort(every), np.arange(num_nodes)), "a budget of the whole graph caches every row"
    k = int(plan.ranked_gid.shape[0])
    assert k < num_nodes, "the fixture must leave rows that pre-sampling never requested"
    assert np.array_equal(every[:k], plan.ranked_gid)
    in_degree = partition.in_degree()
    assert np.all(np.diff(in_degree[every[k:]]) <= 0), "the rest by in-degree"
    assert np.array_equal(full_ranking(plan.ranked_gid, in_degree), every)
    lo, hi = (int(b) for b in partition.bounds()[:2])
    remote = cache_gids("hotness-remote", partition=partition, hotness=hotness, rank=0, fit=rows_within(5))
    assert remote.shape == (5,) and np.all((remote < lo) | (remote >= hi))
    by_degree = cache_gids("degree", partition=partition, hotness=hotness, rank=0, fit=rows_within(7))
    assert np.array_equal(by_degree, degree_order(in_degree)[:7])


def test_a_cap_on_a_cpu_rank_bounds_the_plan_and_never_raises_it(artifacts):
    """``fills=False`` (a CPU rank's cap, ``CacheBudget.fills``): the plan's rows, at most the cap; a cap above the
    plan caches the plan, not more of the ranking (before, a GPU-sized cap copied the whole graph into RAM)."""
    partition, hotness = artifacts
    for policy in ("hotness", "hotness-remote", "degree"):
        planned = cache_gids(policy, partition=partition, hotness=hotness, rank=0)
        m = int(planned.shape[0])
        assert m > 3, policy
        big = cache_gids(policy, partition=partition, hotness=hotness, rank=0, fit=rows_within(10**9), fills=False)
        assert np.array_equal(big, planned), policy
        small = cache_gids(policy, partition=partition, hotness=hotness, rank=0, fit=rows_within(3), fills=False)
        assert np.array_equal(small, planned[:3]), policy
        filled = cache_gids(policy, partition=partition, hotness=hotness, rank=0, fit=rows_within(10**9))
        assert filled.shape[0] > m, f"{policy}: a fill of the whole graph takes more than the plan"


def test_the_csr_goes_to_the_device_when_it_fits_its_budget_else_to_pinned_memory():
    """Issue [4/5] item 7: placed before the cache, against the same budget; a CPU rank keeps it in RAM and a
    choice by name is kept. (tests/test_gpu_paths.py samples a pinned CSR on a GPU.)"""
    params = Params(hidden=256, fanouts=(15, 10, 5), batch_size=1024)
    shape = {"in_features": 100, "batch_nodes": largest_batch_nodes(params, one_type(2_400_000))}
    reserve = reserve_bytes(params, **shape)
    free = 80 * GiB
    fill = int(FREE_MARGIN * free) - reserve

    def place(csr_bytes: int, p: Params = params, device: torch.device = GPU, sharing: int = 1):
        return graph_placement(p, device, csr_bytes=csr_bytes, share=DeviceShare(sharing), free_bytes=lambda _: free,
                               **shape)

    assert place(fill).mode == "device" and "fits the device budget" in place(fill).why
    assert place(fill + 1).mode == "uva" and "sampled through UVA" in place(fill + 1).why
    assert place(10 * GiB).why.startswith("auto: 10.00 GiB of CSR fits the device budget (0.9 × 80.0 GiB free")
    assert place(fill + 1, device=CPU).mode == "cpu"
    for choice in ("device", "uva"):   # kept whatever the budget says
        assert place(fill + 1, params.model_copy(update={"graph_placement": choice})).mode == choice
    # each of two ranks on the card: half the free memory, to the byte
    half = int(FREE_MARGIN * free / 2) - reserve
    assert place(half, sharing=2).mode == "device" and "/ 2 ranks" in place(half, sharing=2).why
    assert place(half + 1, sharing=2).mode == "uva"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where no CUDA device is")
def test_a_pinned_csr_asked_for_without_a_gpu_fails_in_one_line():
    from stages.runtime.csr import LocalCSR
    from stages.train.rank.rank_data import place_csr
    from storage.errors import InputError

    csr = LocalCSR.from_numpy(np.array([0, 1, 2]), np.array([1, 0]))
    assert csr.nbytes == 3 * 8 + 2 * 8
    with pytest.raises(InputError, match="^graph_placement=uva: a CSR sampled in place needs a CUDA device"):
        place_csr(csr, Params(graph_placement="uva"), GPU, in_features=4, batch_nodes=2)
    same, placed = place_csr(csr, Params(), CPU, in_features=4, batch_nodes=2)
    assert placed.mode == "cpu" and torch.equal(same.indices, csr.indices)


def test_an_auto_csr_too_big_for_its_budget_and_without_uva_falls_back_or_fails_in_one_line(monkeypatch):
    """auto chose pinned memory (the CSR exceeds the device budget) but UVA is unavailable: device memory is tried,
    since the budget keeps a margin and a reserve, and an out-of-memory there is one line naming the fix."""
    from stages.runtime.csr import LocalCSR
    from stages.runtime.uva import UvaUnavailableError
    from stages.train.rank import rank_data
    from storage.errors import InputError

    csr = LocalCSR.from_numpy(np.array([0, 1, 2]), np.array([1, 0]))
    monkeypatch.setattr(rank_data, "graph_placement",
                        lambda *a, **k: GraphPlacementChoice("uva", "auto: 0.00 GiB of CSR exceeds the device budget"))

    def no_uva(self, device):
        raise UvaUnavailableError("the driver refused the pointer")
    monkeypatch.setattr(LocalCSR, "pinned_on", no_uva)
    monkeypatch.setattr(LocalCSR, "to_device", lambda self, device: self)
    _, placed = rank_data.place_csr(csr, Params(), GPU, in_features=4, batch_nodes=2)
    assert placed.mode == "device" and placed.why.endswith("but UVA is unavailable (the driver refused the pointer)")

    def oom(self, device):
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(LocalCSR, "to_device", oom)
    with pytest.raises(InputError, match=r"^graph_placement=auto: this rank's 0.00 GiB of CSR exceed its device "
                                         r"budget, UVA is unavailable \(the driver refused the pointer\) and device "
                                         r"memory cannot hold it: partition the graph into more parts"):
        rank_data.place_csr(csr, Params(), GPU, in_features=4, batch_nodes=2)


def test_rank_data_hands_one_device_share_to_the_csr_placement_and_the_cache(tmp_path, monkeypatch):
    """``RankData.open`` counts what the rank puts on its device beside the cache (here a typed graph's three
    featureless types, learnt: 12 B x hidden a row) and hands the same ``DeviceShare`` to the CSR's placement and to
    the cache's budget, which on a GPU subtract it (above)."""
    from stages.train.rank import rank_data, typed_data
    from stages.train.spec import TrainSpec
    from tests._train_pipeline import build_upstream, train_params

    store = ArtifactStore(tmp_path / "art")
    graph = {"dataset": "synthetic-hetero", "num_nodes": 300, "avg_degree": 10.0, "num_features": 16,
             "num_classes": 8, "seed": 1}
    upstream = build_upstream(store, 1, graph)
    params = train_params(hidden=32, ranks_per_gpu=2)
    spec = TrainSpec(artifacts=store.root, key="k", partition_key=upstream["partition"].key,
                     features_key=upstream["features"].key, hotness_key=upstream["hotness"].key,
                     params=params.model_dump(mode="json"), checkpoint_dir=str(tmp_path / "ckpt"),
                     result_dir=str(tmp_path / "result"))
    shares: dict[str, DeviceShare] = {}
    batch_nodes: dict[str, int] = {}

    def recording(name, real):
        def wrapped(*args, **kwargs):
            shares[name], batch_nodes[name] = kwargs["share"], kwargs["batch_nodes"]
            return real(*args, **kwargs)
        return wrapped
    monkeypatch.setattr(rank_data, "graph_placement", recording("csr", rank_data.graph_placement))
    monkeypatch.setattr(typed_data, "cache_budget", recording("cache", typed_data.cache_budget))
    data = rank_data.RankData.open(spec, 0, 1, 1, CPU)
    partition = PartitionArtifact(store, upstream["partition"])
    learnt = sum(int(data.setup["types"][t]["rows"]) for t in ("author", "field_of_study", "institution"))
    assert learnt > 0 and partition.num_edge_features == 0 and data.link is None
    assert shares["csr"] == shares["cache"] == DeviceShare(1, learnt * 32 * 4 * 3), "one rank: nobody to share with"
    # the typed bound (test_a_typed_batch_grows_by_each_edge_type_into_a_node), the same for both
    assert batch_nodes["csr"] == batch_nodes["cache"] == largest_batch_nodes(params, partition) > 0
    # where the settings let the step be graphed (a lone CUDA rank; faked here), both reserve its second batch
    monkeypatch.setattr(rank_data, "why_not_graphed_setup", lambda *a, **k: None)
    rank_data.RankData.open(spec, 0, 1, 1, CPU)
    assert shares["csr"].graphed and shares["cache"].graphed


def test_rank_data_sizes_a_homogeneous_cache_by_the_same_batch_bound(tmp_path, monkeypatch):
    """The one-type path (``_homogeneous_rows``) hands its cache budget the bound and the prefetched batches the
    CSR's placement got."""
    from stages.train.rank import rank_data
    from stages.train.spec import TrainSpec
    from tests._train_pipeline import train_params

    store = ArtifactStore(tmp_path / "art")
    upstream = build_upstream(store, 1)
    params = train_params(batch_size=4, fanouts=[2, 3], prefetch=2)
    spec = TrainSpec(artifacts=store.root, key="k", partition_key=upstream["partition"].key,
                     features_key=upstream["features"].key, hotness_key=upstream["hotness"].key,
                     params=params.model_dump(mode="json"), checkpoint_dir=str(tmp_path / "ckpt"),
                     result_dir=str(tmp_path / "result"))
    got: dict[str, tuple[int, int]] = {}

    def recording(name, real):
        def wrapped(*args, **kwargs):
            got[name] = kwargs["batch_nodes"], kwargs["share"].prefetched
            return real(*args, **kwargs)
        return wrapped
    monkeypatch.setattr(rank_data, "graph_placement", recording("csr", rank_data.graph_placement))
    monkeypatch.setattr(rank_data, "cache_budget", recording("cache", rank_data.cache_budget))
    rank_data.RankData.open(spec, 0, 1, 1, CPU)
    assert got == {"csr": (4 * (1 + 2 + 6), 2), "cache": (4 * (1 + 2 + 6), 2)}, "prefetch=2: two batches ahead"
