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

from stages.partition import adjacency, csr_ops, footprint
from stages.partition import stage as partition
from stages.partition.assign import assign_parts
from stages.partition.balance import rebalance
from stages.partition.report import partition_report
from storage import ArtifactStore, InputError, Manifest
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact
from storage.zarr_io import ChunkAppender, create_rows_array, open_array, open_group, read_array, write_array
from tests._partition_cases import download_graph
from tests.conftest import artifact_files


@pytest.fixture(scope="module")
def node_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, Manifest]:
    return download_graph(tmp_path_factory.mktemp("art"))


def _tiny_budget(store: ArtifactStore, dl: Manifest, params: partition.Params) -> int:
    """The streamed path's own minimum: a budget that forces it (the in-memory estimate is above)."""
    plan = partition.memory_plan(GraphArtifact(store, dl), params)
    assert plan.in_memory > plan.minimum and not plan.streamed
    return max(plan.minimum, 1 << 20)


def _same_build_streamed(store: ArtifactStore, dl: Manifest, monkeypatch: pytest.MonkeyPatch,
                         **kw: Any) -> tuple[Manifest, Manifest]:
    """The default (in-memory) build and a streamed one under a tiny budget: same key, same bytes."""
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
    return default, small


@pytest.mark.parametrize("method", ["metis", "kaminpar", "random"])
def test_streamed_build_is_byte_identical(node_graph, monkeypatch, method):
    store, dl = node_graph
    _same_build_streamed(store, dl, monkeypatch, method=method)


def test_streamed_link_graph_with_edge_features(tmp_path, monkeypatch):
    """Edge splits and edge attributes on the streamed path: the same bytes (edge_attr laid out chunk by chunk)."""
    store, dl = download_graph(tmp_path, task="link", num_edge_features=3)
    assert GraphArtifact(store, dl).num_edge_features == 3 and dl.summary.get("link_edge_type")
    _same_build_streamed(store, dl, monkeypatch, method="kaminpar")


def _nothing_written(store: ArtifactStore, params: partition.Params, dl: Manifest) -> None:
    folder = os.path.join(store.root, "partition")
    left = os.listdir(folder) if os.path.isdir(folder) else []
    assert [n for n in left if n.startswith(".tmp-")] == []
    assert store.cached(partition.NAME, partition.VERSION, params.key_params(), {"download": dl}) is None


def test_metis_over_budget_fails_in_one_line(tmp_path):
    store, dl = download_graph(tmp_path)
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
    """A typed graph (R edge types per node row) streams to the same bytes too."""
    store, dl = download_graph(tmp_path, dataset="synthetic-hetero")
    assert not GraphArtifact(store, dl).schema.is_homogeneous
    _same_build_streamed(store, dl, monkeypatch, method="kaminpar")


def _messy_edges(rng: np.random.Generator, n: int, e: int, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``e`` directed edges among the first ``n - 40`` nodes (the last 40 isolated), 90 % within a community of
    ``comm``, then the reverse of the first ``e // 4`` (pairs listed both ways), 50 duplicates and 30 self-loops."""
    live = n - 40
    order = np.argsort(comm[:live], kind="stable")
    starts, sizes = np.searchsorted(comm[:live][order], np.arange(comm.max() + 1)), np.bincount(comm[:live])
    src = rng.integers(0, live, e)
    same = order[starts[comm[src]] + rng.integers(0, sizes[comm[src]])]
    dst = np.where(rng.random(e) < 0.9, same, rng.integers(0, live, e))
    loops = rng.integers(0, live, 30)
    return (np.concatenate([src, dst[:e // 4], src[:50], loops]),
            np.concatenate([dst, src[:e // 4], dst[:50], loops]))


def _directed_files(d: Path, n: int = 3000) -> Path:
    """A directed ``files`` dataset (``_messy_edges``: the download drops the duplicates and self-loops)."""
    rng = np.random.default_rng(4)
    d.mkdir()
    comm = rng.integers(0, 4, n)
    np.save(d / "edge_index.npy", np.stack(_messy_edges(rng, n, 5 * n, comm)))
    np.save(d / "x.npy", rng.standard_normal((n, 4)).astype(np.float32))
    np.save(d / "y.npy", comm)
    for name, part in zip(("train", "valid", "test"), np.split(rng.permutation(n), [n // 2, 3 * n // 4])):
        np.save(d / f"{name}_idx.npy", part)
    (d / "meta.json").write_text('{"directed": true}')
    return d


@pytest.fixture(scope="module")
def directed_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, Manifest]:
    root = tmp_path_factory.mktemp("directed")
    store, dl = download_graph(root / "art", dataset="files", path=str(_directed_files(root / "data")))
    assert dl.summary["directed"]
    return store, dl


@pytest.fixture(scope="module")
def typed_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, Manifest]:
    return download_graph(tmp_path_factory.mktemp("typed"), dataset="synthetic-hetero")


@pytest.mark.parametrize("method", ["metis", "kaminpar"])
@pytest.mark.parametrize("graph", ["directed_graph", "typed_graph"])
def test_streamed_symmetrising_is_an_external_sort(graph, method, request, monkeypatch):
    """A directed or typed graph on the streamed path: its symmetric adjacency comes from the external sort (the
    in-memory ``_symmetrise`` is not called; several buckets), and METIS / KaMinPar get the same input, so the
    partition, the key and the Zarr bytes are the in-memory path's."""
    store, dl = request.getfixturevalue(graph)
    real = adjacency._symmetrise
    calls: list[int] = []

    def counted(*args: Any) -> tuple[np.ndarray, np.ndarray]:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(adjacency, "_symmetrise", counted)
    # the sort's floor as its share, so that even this small graph sorts in several buckets
    monkeypatch.setattr(footprint, "sort_share", lambda minimum, held: footprint.SORT_MIN_BYTES)
    default, small = _same_build_streamed(store, dl, monkeypatch, method=method)
    assert calls == [1]   # the in-memory build only
    assert "adjacency_sort_buckets" not in default.summary
    assert small.summary["adjacency_sort_buckets"] > 1
    assert small.summary["adjacency_sort_bytes"] == footprint.SORT_MIN_BYTES
    if method == "kaminpar":
        assert "symmetrise" in small.summary["memory_phase_bytes"]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_external_symmetric_gives_symmetrises_arrays(tmp_path, index_dtype):
    """The external sort's adjacency equals ``_symmetrise``'s on a raw CSR (rows unsorted, with duplicates,
    self-loops and pairs listed both ways; empty rows): ``xadj`` int64, ``adjncy`` a memory map of the same
    values, in several buckets."""
    n = 500
    src, dst = _messy_edges(np.random.default_rng(2), n, 4000, np.random.default_rng(3).integers(0, 3, n))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    indices = src[np.argsort(dst, kind="stable")].astype(index_dtype)
    want_xadj, want_adjncy = adjacency._symmetrise(indptr, indices.astype(np.int64), n)
    assert np.all(np.diff(want_xadj)[-40:] == 0)
    csr = adjacency.external_symmetric(indptr, indices, budget_bytes=1, scratch=str(tmp_path))
    assert csr.buckets > 1
    assert csr.indptr.dtype == np.int64 and np.array_equal(csr.indptr, want_xadj)
    assert isinstance(csr.indices, np.memmap) and np.array_equal(csr.indices, want_adjncy)
