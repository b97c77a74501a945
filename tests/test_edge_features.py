"""Edge features: download (synthetic, files, the canonical path) → partition, checked edge by edge in orig ids.

ID spaces: the download artifact is in orig ids; the partition's edges are (dst gid, src gid), a part's edge's
position in its ``indices`` is its elid and ``edge_bounds[p] + elid`` its egid (``storage.partition``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stages.download.canonical import csr_with_edge_attr
from stages.download.files_source import load_files
from storage import InputError
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact
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
