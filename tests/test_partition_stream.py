"""The partition stage under a memory budget ([2/5] "graphs larger than memory"): with ``memory_budget_bytes`` below
the in-memory estimate it reads the graph as memory maps and writes each part chunk by chunk, and must write the
same bytes under the same key; budgets it cannot meet fail in one line before anything is written; ids go to disk
as int32 and come back as int64."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.partition import csr_ops
from stages.partition import stage as partition
from stages.partition.assign import assign_parts
from stages.partition.balance import rebalance
from stages.partition.report import partition_report
from storage import ArtifactStore, InputError, Manifest
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact
from storage.zarr_io import ChunkAppender, create_rows_array, open_array, open_group, read_array, write_array
from tests._train_pipeline import build_without_prefect
from tests.conftest import artifact_files

GRAPH = {"num_nodes": 3000, "avg_degree": 10, "num_features": 4, "num_classes": 3, "seed": 5}


def _download(root: Path, **extra: Any) -> tuple[ArtifactStore, Manifest]:
    store, m = build_without_prefect({"artifacts": str(root), **GRAPH, **extra, "until": "download"})
    return store, m["download"]


@pytest.fixture(scope="module")
def node_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, Manifest]:
    return _download(tmp_path_factory.mktemp("art"))


def _tiny_budget(store: ArtifactStore, dl: Manifest, params: partition.Params) -> int:
    """The streamed path's own minimum: a budget that forces it (the in-memory estimate is above)."""
    plan = partition.memory_plan(GraphArtifact(store, dl), params)
    assert plan.in_memory > plan.minimum and not plan.streamed
    return max(plan.minimum, 1 << 20)


def _same_build_streamed(store: ArtifactStore, dl: Manifest, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> None:
    params = partition.Params(num_partitions=3, **kw)
    default = partition.run(store, params, {"download": dl}, progress=False)
    assert default.summary["memory_path"] == "in-memory"
    before = artifact_files(store, default)
    budget = _tiny_budget(store, dl, params)
    # many row chunks on a small graph, so the chunked passes really chunk
    monkeypatch.setattr(csr_ops.row_chunks, "__defaults__", (2048,))
    small = partition.run(store, params.model_copy(update={"memory_budget_bytes": budget}), {"download": dl},
                          force=True, progress=False)
    assert small.key == default.key and small.summary["memory_path"] == "streamed"
    after = artifact_files(store, small)
    assert sorted(after) == sorted(before)
    assert [k for k in before if before[k] != after[k]] == []
    assert any(k.endswith("/c/0") for k in after)   # chunk files compared, not only metadata
    for k in ("edge_cut", "nodes", "edges", "train_nodes", "bounds", "edge_split_sizes", "num_edge_features"):
        assert small.summary.get(k) == default.summary.get(k)


@pytest.mark.parametrize("method", ["metis", "kaminpar", "random"])
def test_streamed_build_is_byte_identical(node_graph, monkeypatch, method):
    store, dl = node_graph
    _same_build_streamed(store, dl, monkeypatch, method=method)


def test_streamed_link_graph_with_edge_features(tmp_path, monkeypatch):
    """Edge splits and edge attributes on the streamed path: the same bytes (edge_attr laid out chunk by chunk)."""
    store, dl = _download(tmp_path, task="link", num_edge_features=3)
    assert GraphArtifact(store, dl).num_edge_features == 3 and dl.summary.get("link_edge_type")
    _same_build_streamed(store, dl, monkeypatch, method="kaminpar")


def _nothing_written(store: ArtifactStore, params: partition.Params, dl: Manifest) -> None:
    folder = os.path.join(store.root, "partition")
    left = os.listdir(folder) if os.path.isdir(folder) else []
    assert [n for n in left if n.startswith(".tmp-")] == []
    assert store.find("partition", partition.stage_key(partition.NAME, partition.VERSION, params.key_params(),
                                                       {"download": dl.key})) is None


def test_metis_over_budget_fails_in_one_line(tmp_path):
    store, dl = _download(tmp_path)
    params = partition.Params(num_partitions=3, method="metis", memory_budget_bytes=1 << 20)
    with pytest.raises(InputError) as err:
        partition.run(store, params, {"download": dl}, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "method=kaminpar" in msg and "memory_budget_bytes" in msg
    _nothing_written(store, params, dl)
    assert not os.path.exists(os.path.join(store.root, "partition"))


@pytest.mark.parametrize("method", ["kaminpar", "random"])
def test_budget_below_minimum_fails_in_one_line(node_graph, method):
    store, dl = node_graph
    params = partition.Params(num_partitions=3, method=method, memory_budget_bytes=1 << 20, seed=99)
    with pytest.raises(InputError) as err:
        partition.run(store, params, {"download": dl}, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "needs at least" in msg and "raise memory_budget_bytes" in msg
    _nothing_written(store, params, dl)


def test_ids_are_int32_on_disk_int64_when_read(node_graph):
    store, dl = node_graph
    m = partition.run(store, partition.Params(num_partitions=3, method="random"), {"download": dl}, progress=False)
    art = PartitionArtifact(store, m)
    root = os.path.join(store.root, "partition", m.key)
    book_z = open_group(os.path.join(root, "book.zarr"))
    assert open_array(book_z, "orig_of_gid").dtype == open_array(book_z, "gid_of_orig").dtype == np.int32
    assert open_array(book_z, "bounds").dtype == np.int64 and book_z.attrs["id_dtype"] == "int32"
    book = art.book()
    assert book.orig_of_gid.dtype == book.gid_of_orig.dtype == np.int64
    for p in range(3):
        part_z = open_group(os.path.join(root, f"part-{p}.zarr"))
        assert open_array(part_z, "indices").dtype == np.int32 and open_array(part_z, "indptr").dtype == np.int64
        assert part_z.attrs["id_dtype"] == "int32"
        csr = art.csr(p)
        assert csr.indices.dtype == np.int64
        assert np.array_equal(csr.indices, read_array(part_z, "indices"))


def test_chunk_appender_writes_write_arrays_bytes(tmp_path, monkeypatch):
    """Blocks of any size, appended, give write_array's chunk files (several chunks, a partial last one)."""
    import storage.zarr_io as zio

    monkeypatch.setattr(zio, "chunk_rows_for", lambda n, b, *a, **k: 1000)
    data = np.random.default_rng(0).integers(0, 1 << 30, size=(4321, 2)).astype(np.int32)
    write_array(open_group(str(tmp_path / "a.zarr"), mode="w"), "x", data)
    out = ChunkAppender(create_rows_array(open_group(str(tmp_path / "b.zarr"), mode="w"), "x", data.shape,
                                          data.dtype))
    for lo, hi in ((0, 7), (7, 1500), (1500, 1501), (1501, 4000), (4000, 4321)):
        out.append(data[lo:hi])
    out.close()
    for d, _, names in os.walk(tmp_path / "a.zarr"):
        for name in names:
            rel = os.path.relpath(os.path.join(d, name), tmp_path / "a.zarr")
            assert (tmp_path / "a.zarr" / rel).read_bytes() == (tmp_path / "b.zarr" / rel).read_bytes(), rel


def test_chunked_assign_report_balance_equal_in_memory(node_graph, tmp_path, monkeypatch):
    """assign_parts, rebalance and partition_report on memory maps (int32 indices, as a newer download stage
    stores them), in many row chunks, equal the in-memory calls."""
    store, dl = node_graph
    g = GraphArtifact(store, dl).read(features=False)
    train = np.zeros(g.num_nodes, dtype=bool)
    train[g.splits["train"]] = True
    np.save(tmp_path / "indptr.npy", g.indptr)
    np.save(tmp_path / "indices.npy", g.indices.astype(np.int32))
    indptr_mm, indices_mm = np.load(tmp_path / "indptr.npy", mmap_mode="r"), np.load(tmp_path / "indices.npy",
                                                                                     mmap_mode="r")
    want_part = assign_parts(g.indptr, g.indices, train, 3, method="kaminpar", seed=1)
    want_report = partition_report(g.indptr, g.indices, want_part, train, 3)
    start = np.random.default_rng(0).integers(0, 3, g.num_nodes)
    want_balanced, want_moves = rebalance(g.indptr, g.indices, start.copy(), train, 3,
                                          edge_weight=np.diff(g.indptr))
    monkeypatch.setattr(csr_ops.row_chunks, "__defaults__", (1000,))
    part = assign_parts(indptr_mm, indices_mm, train, 3, method="kaminpar", seed=1, scratch_dir=str(tmp_path))
    assert np.array_equal(part, want_part)
    assert partition_report(indptr_mm, indices_mm, part, train, 3) == want_report
    balanced, moves = rebalance(indptr_mm, indices_mm, start.copy(), train, 3, edge_weight=np.diff(g.indptr))
    assert np.array_equal(balanced, want_balanced) and moves == want_moves


def test_streamed_typed_graph(tmp_path, monkeypatch):
    """A typed graph (symmetrised in memory, budgeted in the minimum; R edge types per node row) streams to the
    same bytes too."""
    store, dl = _download(tmp_path, dataset="synthetic-hetero")
    assert not GraphArtifact(store, dl).schema.is_homogeneous
    _same_build_streamed(store, dl, monkeypatch, method="kaminpar")
