"""Edge features: download (synthetic, files, the canonical path) → partition, checked edge by edge in orig ids.

ID spaces: the download artifact is in orig ids; the partition's edges are (dst gid, src gid), a part's edge's
position in its ``indices`` is its elid and ``edge_bounds[p] + elid`` its egid (``storage.partition``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stages.download import stage as download
from stages.download.canonical import csr_with_edge_attr
from stages.download.edge_split import split_edges
from stages.download.files_source import load_files
from stages.download.synthetic import generate_synthetic
from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler
from stages.train.models.model import build_model, seed_logits
from storage import InputError
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact
from tests._edge_worker import TIMEOUT_S, WORLD_SIZE, edge_bounds_of, edge_truth
from tests._edge_worker import worker as edge_worker
from tests._sampler_graphs import power_law_graph
from tests._spawn import spawn_ranks
from tests._train_pipeline import build_without_prefect

EDGE_GRAPH = {"num_nodes": 1200, "avg_degree": 8.0, "num_features": 8, "num_classes": 3, "seed": 5,
              "num_edge_features": 4}


def _orig_attr_by_pair(indptr: np.ndarray, indices: np.ndarray, attr: np.ndarray) -> dict[tuple[int, int], tuple]:
    dst = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return {(int(s), int(d)): tuple(a) for s, d, a in zip(indices, dst, attr)}


def test_canonical_carries_attrs_through_symmetrise_dedupe_sort():
    # edges: 0->1 (a), 1->0 listed too (b), 2->1 twice (c then d), a self-loop 3->3 (e)
    src = np.array([0, 1, 2, 2, 3])
    dst = np.array([1, 0, 1, 1, 3])
    attr = np.arange(5, dtype=np.float32)[:, None] * np.array([[1.0, -1.0]], dtype=np.float32)
    indptr, indices, out = csr_with_edge_attr(src, dst, 4, attr, directed=False)
    got = _orig_attr_by_pair(indptr, indices, out)
    # a listed direction keeps its own attr; the first of duplicates wins; a reversed edge copies its edge's
    assert got == {(0, 1): (0.0, -0.0), (1, 0): (1.0, -1.0), (2, 1): (2.0, -2.0), (1, 2): (2.0, -2.0)}
    indptr_d, indices_d, out_d = csr_with_edge_attr(src, dst, 4, attr, directed=True)
    assert _orig_attr_by_pair(indptr_d, indices_d, out_d) == {(0, 1): (0.0, -0.0), (1, 0): (1.0, -1.0),
                                                              (2, 1): (2.0, -2.0)}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    values = {f"download.{k}": v for k, v in EDGE_GRAPH.items()}
    store, m = build_without_prefect({**values, "artifacts": str(tmp_path_factory.mktemp("art")),
                                      "num_partitions": 3, "until": "partition"})
    return store, m["download"], m["partition"]


def test_synthetic_edge_attrs_are_symmetric_and_say_same_label(built):
    store, dl, _ = built
    g = GraphArtifact(store, dl).read()
    assert g.edge_attr is not None and g.edge_attr.shape == (g.num_edges, 4) and dl.summary["num_edge_features"] == 4
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    assert np.array_equal(g.edge_attr[:, 0], (g.y[g.indices] == g.y[dst]).astype(np.float32))
    by_pair = _orig_attr_by_pair(g.indptr, g.indices, g.edge_attr)
    assert all(by_pair[(d, s)] == a for (s, d), a in by_pair.items()), "a reversed edge has its edge's attributes"


def test_partition_keeps_every_edges_attr(built):
    store, dl, pt = built
    g = GraphArtifact(store, dl).read()
    by_pair = _orig_attr_by_pair(g.indptr, g.indices, g.edge_attr)
    part = PartitionArtifact(store, pt)
    book, edge_bounds = part.book(), part.edge_bounds()
    assert part.num_edge_features == 4 and edge_bounds[-1] == g.num_edges
    for p in range(part.num_partitions):
        csr, attr = part.csr(p), part.edge_attr(p)
        assert attr.shape == (edge_bounds[p + 1] - edge_bounds[p], 4) == (csr.indices.shape[0], 4)
        dst_gid = csr.start_gid + np.repeat(np.arange(csr.num_nodes), np.diff(csr.indptr))
        for s, d, a in zip(book.orig_of_gid[csr.indices], book.orig_of_gid[dst_gid], attr):
            assert by_pair[(int(s), int(d))] == tuple(a)


def _files_dataset(d: Path, edge_attr: np.ndarray | None) -> Path:
    d.mkdir()
    n = 6
    np.save(d / "edge_index.npy", np.array([[0, 1, 2, 3, 4, 2], [1, 2, 3, 4, 5, 1]]))
    np.save(d / "x.npy", np.eye(n, dtype=np.float32))
    np.save(d / "y.npy", np.array([0, 1, 0, 1, 0, 1]))
    for name, idx in (("train", [0, 1]), ("valid", [2, 3]), ("test", [4, 5])):
        np.save(d / f"{name}_idx.npy", np.array(idx))
    if edge_attr is not None:
        np.save(d / "edge_attr.npy", edge_attr)
    return d


def test_files_edge_attr_follows_the_listed_edges(tmp_path: Path):
    attr = np.array([10, 11, 12, 13, 14, 15], dtype=np.float64)   # [E]: one column; edge 5 duplicates edge 1's pair
    g = load_files(str(_files_dataset(tmp_path / "g", attr)))
    assert g.edge_attr is not None and g.edge_attr.dtype == np.float32
    got = _orig_attr_by_pair(g.indptr, g.indices, g.edge_attr)
    assert got[(0, 1)] == got[(1, 0)] == (10.0,) and got[(2, 1)] == (15.0,) and got[(1, 2)] == (11.0,)
    assert load_files(str(_files_dataset(tmp_path / "plain", None))).edge_attr is None


@pytest.mark.parametrize("attr, message", [
    (np.zeros((5, 2), dtype=np.float32), r"edge_attr.npy has shape \(5, 2\) but the topology lists 6 edges"),
    (np.array([[0.0], [1.0], [np.nan], [0.0], [0.0], [0.0]]), "edge_attr.npy in .* has NaN at row 2, column 0"),
    (np.array(["a"] * 6), "edge_attr.npy has dtype <U1; edge features must be numbers"),
])
def test_files_bad_edge_attr_is_one_error_line(tmp_path: Path, attr: np.ndarray, message: str):
    with pytest.raises(InputError, match=message):
        load_files(str(_files_dataset(tmp_path / "g", attr)))


# --- sampling: e_id and edge_attr --------------------------------------------------------------------------------

def _check_edges(fields: dict, truth: np.ndarray) -> None:
    """Every sampled edge's e_id names the edge (src, dst) it joins, and its edge_attr row is that edge's."""
    n_id, edge_index, e_id = fields["n_id"], fields["edge_index"], fields["e_id"]
    assert e_id is not None and e_id.dtype == torch.long and e_id.shape == (edge_index.shape[1],)
    src_gid, dst_gid = n_id[edge_index[0]], n_id[edge_index[1]]
    row = torch.from_numpy(truth)[e_id]
    assert torch.equal(row[:, 0].long(), src_gid) and torch.equal(row[:, 1].long(), dst_gid)
    if fields.get("edge_attr") is not None:
        assert torch.equal(fields["edge_attr"], row)


def test_single_sampler_e_id_and_edge_attr_name_the_sampled_edges():
    indptr, indices = power_law_graph()
    truth = edge_truth(indptr, indices)
    smp = NeighborSampler(LocalCSR.from_numpy(indptr, indices), [5, 3], generator=torch.Generator().manual_seed(0))
    plain = NeighborSampler(LocalCSR.from_numpy(indptr, indices), [5, 3],
                            generator=torch.Generator().manual_seed(0))
    smp.with_edges, smp.edge_attr = True, torch.from_numpy(truth)
    plain.edge_attr = torch.from_numpy(truth)   # without with_edges: no rows either
    for seed_gid in (torch.arange(0, 40), torch.tensor([3]), torch.empty(0).long()):
        batch, ref = smp.sample(seed_gid), plain.sample(seed_gid)
        assert batch.edge_attr.shape == (batch.edge_index.shape[1], 3)
        _check_edges({"n_id": batch.n_id, "edge_index": batch.edge_index, "e_id": batch.e_id,
                      "edge_attr": batch.edge_attr}, truth)
        # the same draws with and without edges; no e_id without them
        assert torch.equal(batch.n_id, ref.n_id) and torch.equal(batch.edge_index, ref.edge_index)
        assert "e_id" not in ref and "edge_attr" not in ref


@pytest.fixture(scope="module")
def ranks_out(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_ranks(edge_worker, (), tmp_path_factory.mktemp("edges"), WORLD_SIZE, TIMEOUT_S)


def test_dist_sampler_e_id_and_edge_attr_are_the_truth(ranks_out):
    indptr, indices = power_law_graph()
    truth = edge_truth(indptr, indices)
    edge_bounds = edge_bounds_of(indptr)
    for rank, out in enumerate(ranks_out):
        remote = 0
        for name in ("edges", "edges_replace"):
            for fields in out[name]:
                assert fields["edge_attr"] is not None
                _check_edges(fields, truth)
                own = (fields["e_id"] >= edge_bounds[rank]) & (fields["e_id"] < edge_bounds[rank + 1])
                remote += int((~own).sum())
        assert remote > 0, "the batches must include edges another rank owns"
        for name in ("weighted", "weighted_replace"):   # owners sample their edges by weight: none of weight 0
            for fields in out[name]:
                _check_edges(fields, truth)
                assert not bool((fields["e_id"] % 3 == 0).any())
        for plain, edges in zip(out["plain"], out["edges"]):   # with edges: the same batches, plus e_id
            assert plain["e_id"] is None and plain["edge_attr"] is None
            assert torch.equal(plain["n_id"], edges["n_id"]) and torch.equal(plain["edge_index"], edges["edge_index"])


def test_block_gat_with_edge_attr_equals_the_whole_batch_gat():
    """On a batch whose hops list edges in no target order (as the distributed sampler's do), GAT layer by layer on
    the blocks with ``edge_attr`` gives the seeds' outputs of PyG's GAT on the whole batch."""
    indptr, indices = power_law_graph()
    smp = NeighborSampler(LocalCSR.from_numpy(indptr, indices), [4, 3], generator=torch.Generator().manual_seed(1))
    smp.with_edges = True
    batch = smp.sample(torch.arange(100, 130))
    gen = torch.Generator().manual_seed(2)
    lo = 0
    for n in batch.num_sampled_edges:   # shuffle each hop's edges (and their ids) in place
        perm = lo + torch.randperm(n, generator=gen)
        batch.edge_index[:, lo:lo + n] = batch.edge_index[:, perm]
        batch.e_id[lo:lo + n] = batch.e_id[perm]
        lo += n
    attr_of_egid = torch.randn(indices.shape[0], 3, generator=gen)
    batch.edge_attr = attr_of_egid[batch.e_id]
    x = torch.randn(batch.num_nodes, 5, generator=gen)
    model = build_model("gat", in_channels=5, hidden=8, out_channels=3, num_layers=2, dropout=0.0, heads=2,
                        edge_dim=3).eval()
    with torch.no_grad():
        blocks = seed_logits(model, x, batch)
        whole = model(x, batch.edge_index, edge_attr=batch.edge_attr)[:batch.batch_size]
        blind = model(x, batch.edge_index, edge_attr=torch.zeros_like(batch.edge_attr))[:batch.batch_size]
    assert torch.allclose(blocks, whole, atol=1e-5)
    assert not torch.allclose(blocks, blind, atol=1e-3), "the edge features must change the outputs"


def test_link_split_keeps_each_message_passing_edges_attr():
    """task=link holds valid/test edges out of the graph: the remaining edges keep their own rows."""
    graph = generate_synthetic(num_nodes=600, avg_degree=6.0, num_features=4, num_classes=3, seed=2,
                               num_edge_features=2)
    by_pair = _orig_attr_by_pair(graph.indptr, graph.indices, graph.edge_attr)
    mp = split_edges(graph, 0, (0.8, 0.1, 0.1), seed=0)[0]
    assert mp.edge_attr is not None and mp.num_edges < graph.num_edges and mp.edge_attr.shape == (mp.num_edges, 2)
    assert all(by_pair[pair] == attr for pair, attr in _orig_attr_by_pair(mp.indptr, mp.indices,
                                                                           mp.edge_attr).items())


def test_num_edge_features_is_for_the_synthetic_dataset_only():
    assert download.Params(num_edge_features=3).key_params()["num_edge_features"] == 3
    assert "num_edge_features" not in download.Params().key_params()   # keys of graphs without edges as before
    with pytest.raises(InputError, match="num_edge_features=2 is for dataset synthetic; dataset ogbn-arxiv brings"):
        download.Params(dataset="ogbn-arxiv", num_edge_features=2)
