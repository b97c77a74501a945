"""ogbl-collab and ogbl-citation2 on tiny datasets in OGB's raw layout: the real ``ogb`` parses them, then download
(task=link) → partition (2 parts), and every stored positive and negative goes back to OGB's own values."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.ogbl_source import held_out_in_graph, load_ogbl
from stages.partition import stage as partition
from storage import ArtifactStore, Manifest
from storage.errors import InputError
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact, concat_parts
from tests import ogbl_fixture
from tests.ogbl_fixture import NUM_NODES, OgblFixture

# ogb imports torch_geometric, which still calls torch.jit.script.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
NAMES = ("ogbl-collab", "ogbl-citation2")
EVAL = ("valid", "test")
Built = tuple[OgblFixture, ArtifactStore, dict[str, Manifest]]


@pytest.fixture(scope="module", params=NAMES)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The dataset through the download (task=link) and partition (2 parts) stages."""
    tmp = tmp_path_factory.mktemp(request.param)
    fx = ogbl_fixture.build(request.param, tmp / "ogb")
    store = ArtifactStore(tmp / "artifacts")
    params = download.Params(dataset=request.param, task="link", download_dir=str(fx.root))
    graph = download.run(store, params, {}, progress=False)
    parts = partition.run(store, partition.Params(num_partitions=2), {"download": graph}, progress=False)
    return fx, store, {"download": graph, "partition": parts}


def pairs_of(a: np.ndarray) -> list[tuple[int, int]]:
    return sorted(zip(*a.tolist()))


def test_the_graph_is_ogbs_train_edges_deduplicated(built: Built) -> None:
    fx, store, m = built
    g = GraphArtifact(store, m["download"]).read()
    dst = np.repeat(np.arange(NUM_NODES), np.diff(g.indptr))
    edges = set(zip(g.indices.tolist(), dst.tolist()))
    train = set(zip(*fx.positives["train"].tolist()))
    collab = fx.name == "ogbl-collab"
    assert edges == (train | {(v, u) for u, v in train} if collab else train)   # symmetrised / directed, deduped
    assert g.num_edges == len(edges) and g.directed == (not collab)
    assert g.x.dtype == np.float32 and np.array_equal(g.x, fx.x)
    assert g.num_classes == 0 and g.y.tolist() == [-1] * NUM_NODES and all(g.splits[s].size == 0 for s in SPLITS)
    assert g.name == fx.name and fx.name in g.source and g.link_edge_type == "node___edge___node"
    assert m["download"].summary["link_held_out_in_graph"] == {"valid": 0, "test": 0}


def test_the_graph_artifact_keeps_ogbs_positives_and_negatives_as_given(built: Built) -> None:
    fx, store, m = built
    g = GraphArtifact(store, m["download"]).read(features=False, negatives=True)
    assert all(np.array_equal(g.edge_splits[s], fx.positives[s]) for s in SPLITS)   # OGB's order, repeats kept
    assert set(g.edge_split_negatives) == set(EVAL)
    assert all(np.array_equal(g.edge_split_negatives[s], fx.negatives[s]) for s in EVAL)
    assert g.link_eval == ("shared" if fx.name == "ogbl-collab" else "per-positive")
    assert m["download"].summary["edge_split_neg_shapes"] == {s: list(fx.negatives[s].shape) for s in EVAL}
    lazy = GraphArtifact(store, m["download"]).read(features=False)   # the features stage's read
    assert lazy.edge_split_negatives == {} and lazy.link_eval == g.link_eval and "link_eval" not in lazy.extra


def test_the_partition_keeps_positives_and_negatives_with_the_dst_owner(built: Built) -> None:
    fx, store, m = built
    art = PartitionArtifact(store, m["partition"])
    book = art.book()
    assert art.link_eval == GraphArtifact(store, m["download"]).read(features=False).link_eval
    for s in SPLITS:
        parts = [art.edge_split(p, s) for p in range(2)]
        assert all(np.all(book.owner(pos[1]) == p) for p, pos in enumerate(parts))
        assert pairs_of(book.orig_of_gid[np.concatenate(parts, axis=1)]) == pairs_of(fx.positives[s])
    for s in EVAL:
        negs = [art.edge_split_negatives(p, s) for p in range(2)]
        if art.link_eval == "per-positive":   # row i goes with positive i: compare (src, dst, its negatives)
            got = sorted((int(u), int(v), tuple(row)) for p in range(2) for (u, v), row in
                         zip(book.orig_of_gid[art.edge_split(p, s)].T, book.orig_of_gid[negs[p]].tolist()))
            want = sorted((int(u), int(v), tuple(row)) for (u, v), row in
                          zip(fx.positives[s].T, fx.negatives[s].tolist()))
            assert got == want
        else:
            assert all(np.all(book.owner(neg[1]) == p) for p, neg in enumerate(negs))
            assert pairs_of(book.orig_of_gid[np.concatenate(negs, axis=1)]) == pairs_of(fx.negatives[s])
    assert [{s: list(art.edge_split_negatives(p, s).shape) for s in EVAL} for p in range(2)] == \
        m["partition"].summary["edge_split_neg_shapes"]


def test_no_held_out_positive_passes_messages(built: Built) -> None:
    _, store, m = built
    art = PartitionArtifact(store, m["partition"])
    indptr, indices = concat_parts([art.csr(p) for p in range(2)])
    in_graph = set(zip(indices.tolist(), np.repeat(np.arange(NUM_NODES), np.diff(indptr)).tolist()))
    for s in SPLITS:
        held = {(int(u), int(v)) for p in range(2) for u, v in art.edge_split(p, s).T}
        both_ways = held | {(v, u) for u, v in held}
        assert held <= in_graph if s == "train" else not both_ways & in_graph, s


def test_ogbs_evaluator_takes_scores_in_the_stored_shapes(built: Built) -> None:
    import torch
    from ogb.linkproppred import Evaluator

    fx, store, m = built
    art = PartitionArtifact(store, m["partition"])
    rng = np.random.default_rng(0)
    for s in EVAL:
        positives = np.concatenate([art.edge_split(p, s) for p in range(2)], axis=1)
        axis = 1 if art.link_eval == "shared" else 0   # shared: pairs along columns; per-positive: rows
        negatives = np.concatenate([art.edge_split_negatives(p, s) for p in range(2)], axis=axis)
        neg_scores = torch.from_numpy(rng.random(negatives.shape[1] if axis else negatives.shape))
        pos_scores = torch.from_numpy(rng.random(positives.shape[1]))   # torch: ogb 1.3.6's numpy MRR path is broken
        result = Evaluator(fx.name).eval({"y_pred_pos": pos_scores, "y_pred_neg": neg_scores})
        if fx.name == "ogbl-collab":
            assert set(result) == {"hits@50"}
        else:
            assert len(result["mrr_list"]) == positives.shape[1] == fx.positives[s].shape[1]


def test_a_held_out_pair_that_repeats_a_train_pair_is_counted(built: Built) -> None:
    fx, store, m = built
    g = GraphArtifact(store, m["download"]).read(features=False)
    repeat = replace(g, edge_splits={**g.edge_splits, "test": fx.positives["train"][:, :2]})
    assert held_out_in_graph(repeat) == {"valid": 0, "test": 2}


@pytest.mark.parametrize("name", NAMES)
def test_ogbl_needs_task_link_and_ogbs_split_is_the_key(name: str) -> None:
    with pytest.raises(InputError, match=f"dataset {name} is made for link prediction: set task=link"):
        download.Params(dataset=name)
    odd = download.Params(dataset=name, task="link", link_split=(0.5, 0.1, 0.1), link_edge_type="x", seed=3)
    assert odd.key_params() == download.Params(dataset=name, task="link").key_params() == {"dataset": name,
                                                                                          "task": "link"}


def test_the_synthetic_link_key_still_has_its_split() -> None:
    assert set(download.Params(dataset="synthetic-link", task="link").key_params()) >= {"link_split", "seed"}


def test_a_second_load_reads_ogbs_cache(tmp_path: Path) -> None:
    # ogb reloads processed/data_processed with torch.load, which PyTorch >= 2.6 refuses by default.
    ogbl_fixture.build("ogbl-citation2", tmp_path)
    first = load_ogbl("ogbl-citation2", str(tmp_path))
    (tmp_path / "ogbl_citation2" / "raw" / "edge.csv.gz").unlink()   # so the second load can only use the cache
    second = load_ogbl("ogbl-citation2", str(tmp_path))
    assert np.array_equal(first.indices, second.indices) and np.array_equal(first.x, second.x)


def test_an_outdated_directory_fails_instead_of_prompting_and_ogb_is_restored(tmp_path: Path) -> None:
    import ogb.linkproppred.dataset as ogb_dataset

    before = ogb_dataset.decide_download, ogb_dataset.torch
    (tmp_path / "ogbl_collab" / "raw").mkdir(parents=True)
    (tmp_path / "ogbl_collab" / "RELEASE_v0.txt").write_text("")
    with pytest.raises(InputError, match=r"ogbl_collab is an incomplete or outdated OGB download .*delete it"):
        load_ogbl("ogbl-collab", str(tmp_path))
    assert (ogb_dataset.decide_download, ogb_dataset.torch) == before and "input" not in vars(ogb_dataset)


def test_a_missing_split_file_is_an_input_error(tmp_path: Path) -> None:
    ogbl_fixture.build("ogbl-collab", tmp_path)
    (tmp_path / "ogbl_collab" / "split" / "time" / "valid.pt").unlink()
    with pytest.raises(InputError, match="could not load ogbl-collab from .*delete that directory and rerun"):
        load_ogbl("ogbl-collab", str(tmp_path))
