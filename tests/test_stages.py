"""The download → partition → features stages end to end, called directly (no Prefect), checked against the source.

ID spaces: the download artifact is in orig ids; partition/features artifacts in gids and lids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stages.download import stage as download
from stages.features import stage as features
from stages.features import units
from stages.partition import stage as partition
from storage import InputError
from storage.features import FeaturesArtifact
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact
from tests._train_pipeline import build_without_prefect


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    store, m = build_without_prefect({"artifacts": str(tmp_path_factory.mktemp("art")), "num_nodes": 1500,
                                      "avg_degree": 8, "num_features": 8, "num_classes": 3, "seed": 3,
                                      "num_partitions": 3, "chunk_rows": 128, "until": "features"})
    return store, m["download"], m["partition"], m["features"]


def test_download_artifact_is_canonical(built):
    store, dl, _, _ = built
    g = GraphArtifact(store, dl).read()
    assert g.num_nodes == 1500 and g.x.shape == (1500, 8) and g.y.dtype == np.int64
    assert dl.summary["num_edges"] == g.num_edges and dl.summary["num_classes"] == 3
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    assert not np.any(rows == g.indices), "self-loops must be removed"
    pairs = rows * g.num_nodes + g.indices
    assert np.unique(pairs).size == pairs.size, "duplicate edges must be removed"
    reverse = g.indices * g.num_nodes + rows
    assert np.array_equal(np.sort(pairs), np.sort(reverse)), "an undirected graph is stored symmetrised"


def test_partition_artifact_relabels_exactly(built):
    store, dl, pt, _ = built
    g = GraphArtifact(store, dl).read(features=False)
    book = PartitionArtifact(store, pt).book()
    assert np.array_equal(book.gid_of_orig[book.orig_of_gid], np.arange(g.num_nodes))
    orig_rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    orig_pairs = np.sort(orig_rows * g.num_nodes + g.indices)
    gid_pairs = []
    for p in range(book.num_partitions):
        csr = PartitionArtifact(store, pt).csr(p)
        assert csr.start_gid == book.bounds[p] and csr.num_nodes == book.bounds[p + 1] - book.bounds[p]
        dst_gid = csr.start_gid + np.repeat(np.arange(csr.num_nodes), np.diff(csr.indptr))
        # back to orig ids: every gid edge is exactly one orig edge
        gid_pairs.append(book.orig_of_gid[dst_gid] * g.num_nodes + book.orig_of_gid[csr.indices])
    assert np.array_equal(np.sort(np.concatenate(gid_pairs)), orig_pairs)
    s = pt.summary
    assert sum(s["nodes"]) == g.num_nodes and sum(s["edges"]) == g.num_edges
    assert s["bounds"] == [int(b) for b in book.bounds]


def test_features_follow_the_relabelling(built):
    store, dl, pt, ft = built
    g = GraphArtifact(store, dl).read()
    book = PartitionArtifact(store, pt).book()
    for p in range(book.num_partitions):
        part = FeaturesArtifact(store, ft).part(p)
        gids = np.arange(book.bounds[p], book.bounds[p + 1])
        assert np.array_equal(part.x, g.x[book.orig_of_gid[gids]])
        assert np.array_equal(part.y, g.y[book.orig_of_gid[gids]])
        for name in SPLITS:
            expect_orig = np.intersect1d(g.splits[name], book.orig_of_gid[gids])
            got_orig = book.orig_of_gid[part.split_lids[name] + part.start_gid]
            assert np.array_equal(np.sort(got_orig), expect_orig)
        assert part.attrs["types"]["node"]["chunk_rows"] == 128
    assert sum(r["rows"] for r in ft.summary["parts"]) == g.num_nodes


def test_reports_render(built):
    _, dl, pt, ft = built
    for module, manifest in ((download, dl), (partition, pt), (features, ft)):
        report = module.report(manifest)
        assert report.headline and report.table and "|" in report.markdown
    assert "edge cut" in partition.report(pt).headline


def test_single_partition_needs_no_metis(built, monkeypatch):
    store, dl, _, _ = built
    import pymetis

    monkeypatch.setattr(pymetis, "part_graph", lambda *a, **k: pytest.fail("METIS called for 1 partition"))
    pt = partition.run(store, partition.Params(num_partitions=1), {"download": dl}, progress=False)
    assert pt.summary["bounds"] == [0, 1500] and pt.summary["edge_cut"] == 0


def test_partition_count_is_checked(built):
    store, dl, _, _ = built
    with pytest.raises(InputError, match="exceeds the graph's 1500 nodes"):
        partition.run(store, partition.Params(num_partitions=1501), {"download": dl}, progress=False)


def test_default_chunk_rows_even_out_the_last_chunk():
    rows = units.default_chunk_rows(100_000, 400)
    assert 8192 <= rows <= 65536 and -(-100_000 // rows) * rows - 100_000 < -(-100_000 // rows)
    assert units.default_chunk_rows(10, 400) == 10


def test_files_dataset_fingerprint_changes_with_the_files(tmp_path: Path):
    (tmp_path / "x.npy").write_bytes(b"1")
    a = download.files_fingerprint(str(tmp_path))
    (tmp_path / "x.npy").write_bytes(b"12")
    assert download.files_fingerprint(str(tmp_path)) != a
    with pytest.raises(InputError, match="does not exist"):
        download.files_fingerprint(str(tmp_path / "nope"))


def test_artifact_handles_agree_with_the_book_and_the_parts(built):
    store, dl, pt, ft = built
    partition, feats = PartitionArtifact(store, pt), FeaturesArtifact(store, ft)
    book = partition.book()
    assert GraphArtifact(store, dl).num_nodes == book.num_nodes == 1500
    assert partition.num_partitions == book.num_partitions == 3
    assert np.array_equal(partition.bounds(), book.bounds)
    in_degree_of_gid = np.concatenate([np.diff(partition.csr(p).indptr) for p in range(3)])
    assert np.array_equal(partition.in_degree(), in_degree_of_gid)
    assert (feats.num_features, feats.feature_dtype, feats.num_classes) == (8, np.dtype("float32"), 3)
    assert feats.row_bytes == 8 * 4
    part = feats.part(2, load_x=False)
    assert part.x.shape == (0, 8) and part.start_gid == book.bounds[2]
    x = feats.x(2)   # lazy: what a rank's feature store opens
    assert x.shape == (int(book.bounds[3] - book.bounds[2]), 8)
    assert np.array_equal(np.asarray(x[:5]), feats.part(2).x[:5])
    with pytest.raises(ValueError, match="PartitionArtifact reads a partition artifact, not download/"):
        PartitionArtifact(store, dl)
