"""The download stage under a memory budget: the external sort builds the in-memory path's CSR, a streamed build
(task=link included: its held-out edge split) writes the same bytes under the same key, a too-small budget or a
full disk leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.canonical import to_csr_incoming
from stages.download.edge_split_stream import HELD_PAIR_BYTES, _held_positions
from stages.download.streamed import choose
from stages.external_sort import array_chunks, csr_chunks, external_csr
from stages.memory import MemoryBudget
from storage import ArtifactStore, InputError
from storage.graph import GraphArtifact
from storage.write_errors import StoreWriteError
from storage.zarr_io import open_group, read_array, write_array, write_columns
from tests._download_cases import SYNTHETIC, chunk_files, disk_full_after, leftovers, messy_edges


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_external_sort_matches_the_in_memory_csr(tmp_path: Path, directed: bool, dtype: type) -> None:
    src, dst = messy_edges(np.random.default_rng(0), 600, 5000, dtype)
    indptr, indices = to_csr_incoming(src, dst, 600, directed=directed)
    csr = external_csr(array_chunks(src, dst, 777), 600, symmetrise=not directed, budget_bytes=40_000,
                       scratch=str(tmp_path))
    assert csr.buckets > 1   # the budget really splits it
    assert np.array_equal(csr.indptr, indptr) and np.array_equal(np.asarray(csr.indices), indices)
    assert csr.indices.dtype == np.int32
    assert sorted(os.listdir(tmp_path)) == ["indices.raw"]   # bucket files are removed as they are used
    # a CSR input (rows never split across chunks) gives the same again
    (tmp_path / "again").mkdir()
    again = external_csr(csr_chunks(indptr, indices, 100), 600, symmetrise=False, budget_bytes=1,
                         scratch=str(tmp_path / "again"))
    assert np.array_equal(again.indptr, indptr) and np.array_equal(np.asarray(again.indices), indices)


def test_external_sort_of_no_edges(tmp_path: Path) -> None:
    csr = external_csr(array_chunks(np.array([1, 2]), np.array([1, 2]), 10), 5, symmetrise=True, budget_bytes=1,
                       scratch=str(tmp_path))
    assert csr.indptr.tolist() == [0] * 6 and csr.indices.shape == (0,)


def _files_dataset(d: Path, n: int = 3000, e: int = 100_000, directed: bool = False) -> Path:
    rng = np.random.default_rng(1)
    d.mkdir()
    if directed:
        (d / "meta.json").write_text('{"directed": true}')
    src, dst = messy_edges(rng, n, e, np.int64)
    np.save(d / "edge_index.npy", np.stack([src, dst]))
    np.save(d / "x.npy", rng.standard_normal((n, 5)).astype(np.float32))
    np.save(d / "y.npy", rng.integers(0, 3, n))
    order = rng.permutation(n)
    for name, part in zip(("train", "valid", "test"), np.split(order, [n // 2, 3 * n // 4]), strict=True):
        np.save(d / f"{name}_idx.npy", part)
    return d


@pytest.mark.parametrize("kind", ["files", "synthetic"])
def test_streamed_build_writes_the_same_bytes_under_the_same_key(tmp_path: Path, kind: str) -> None:
    # budgets just below each in-memory estimate (~4.2 MB, ~10 MB) and above the streaming minimum (~2.5, ~4.6 MB)
    params, budget = (({"dataset": "files", "path": str(_files_dataset(tmp_path / "data"))}, 3 << 20)
                      if kind == "files" else (SYNTHETIC, 5 << 20))
    built = {}
    for name, limit in (("memory", None), ("stream", budget)):
        store = ArtifactStore(tmp_path / name)
        built[name] = download.run(store, download.Params(**params, memory_budget_bytes=limit), {},
                                   progress=False)
        assert not leftovers(tmp_path / name)
    memory, stream = built["memory"], built["stream"]
    assert memory.summary["canonical_path"] == "in-memory"
    assert stream.summary["canonical_path"] == "external sort" and stream.summary["sort_buckets"] > 1
    assert stream.summary["memory_budget_bytes"] == budget and stream.summary["spill_bytes"] > 0
    assert stream.key == memory.key
    assert chunk_files(tmp_path / "memory") == chunk_files(tmp_path / "stream")
    graph = GraphArtifact(ArtifactStore(tmp_path / "stream"), stream).read()
    assert graph.indices.dtype == np.int64 and graph.splits["train"].dtype == np.int64   # widened on read
    native = GraphArtifact(ArtifactStore(tmp_path / "stream"), stream).read(native=True)
    assert native.indices.dtype == np.int32 and stream.summary["index_dtype"] == "int32"
    assert np.array_equal(native.indices, graph.indices)


def test_a_budget_below_the_minimum_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    params = download.Params(**SYNTHETIC, memory_budget_bytes=1 << 20)
    with pytest.raises(InputError) as err:
        download.run(ArtifactStore(tmp_path / "root"), params, {}, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "raise memory_budget_bytes to" in msg and "at least" in msg
    assert not (tmp_path / "root" / "download").exists()


def test_a_source_that_does_not_stream_names_its_estimate(tmp_path: Path) -> None:
    params = download.Params(**SYNTHETIC | {"num_edge_features": 2}, memory_budget_bytes=5 << 20)
    with pytest.raises(InputError, match=r"does not stream yet\) and needs about .* raise memory_budget_bytes"):
        download.run(ArtifactStore(tmp_path / "root"), params, {}, progress=False)
    assert not (tmp_path / "root" / "download").exists()


def test_a_full_disk_during_a_spill_leaves_nothing_half_written(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    disk_full_after(3, monkeypatch)
    root = tmp_path / "root"
    params = download.Params(dataset="files", path=str(_files_dataset(tmp_path / "data")),
                             memory_budget_bytes=3 << 20)
    with pytest.raises(StoreWriteError, match=r"^download stage: cannot write to .*No space left on device"):
        download.run(ArtifactStore(root), params, {}, progress=False)
    assert not leftovers(root) and not (root / "download").exists()


def test_the_permutation_is_numpys_shuffled_on_disk(tmp_path: Path) -> None:
    # split_edges draws default_rng(seed).permutation(P); the streamed split shuffles a memory-mapped int32 arange
    # instead: this holds only while numpy's permutation(int) is arange + shuffle and the draws ignore the dtype
    for num_pairs, seed in ((0, 0), (1, 3), (5, 1), (100_003, 7)):
        order = np.random.default_rng(seed).permutation(num_pairs)
        n_valid, n_test = num_pairs // 10, num_pairs // 5
        valid, test = _held_positions(num_pairs, n_valid, n_test, seed, str(tmp_path), block=4096)
        assert np.array_equal(valid, np.sort(order[:n_valid]))
        assert np.array_equal(test, np.sort(order[n_valid:n_valid + n_test]))
        assert os.listdir(tmp_path) == []   # the permutation's file is removed once read


def test_a_split_longer_than_one_chunk_is_written_by_column_chunks(tmp_path: Path) -> None:
    pairs = np.random.default_rng(0).integers(0, 1000, (50_000, 2)).astype(np.int32)
    root = open_group(str(tmp_path / "g.zarr"), mode="w")
    arr = write_columns(root, "cut", pairs.T, dtype=np.int32, chunk_columns=9_000)   # a transposed view, as streamed
    assert arr.chunks == (2, 9_000) and np.array_equal(read_array(root, "cut"), pairs.T)
    # what fits one chunk is write_array's one chunk, byte for byte: splits written before keep their bytes
    write_columns(root, "one", pairs.T[:, :7000], dtype=np.int32)
    write_array(root, "old", pairs.T[:, :7000], dtype=np.int32)
    assert (tmp_path / "g.zarr/one/c/0/0").read_bytes() == (tmp_path / "g.zarr/old/c/0/0").read_bytes()


@pytest.mark.parametrize("kind", ["files", "files-directed", "synthetic-link"])
def test_a_streamed_link_split_writes_the_same_bytes_under_the_same_key(tmp_path: Path, kind: str) -> None:
    # budgets below the in-memory estimates (~29 MB, ~35 MB) and above the streaming minima (~1.5 MB, ~5.3 MB)
    files = {"dataset": "files", "path": str(_files_dataset(tmp_path / "data", directed=kind == "files-directed"))} \
        if kind != "synthetic-link" else None
    params, budget = (files, 3 << 20) if files else (SYNTHETIC | {"dataset": "synthetic-link"}, 6 << 20)
    built = {}
    for name, limit in (("memory", None), ("stream", budget)):
        built[name] = download.run(ArtifactStore(tmp_path / name), download.Params(
            **params, task="link", link_split=(0.8, 0.05, 0.15), seed=4, memory_budget_bytes=limit), {},
            progress=False)
        assert not leftovers(tmp_path / name)
    memory, stream = built["memory"], built["stream"]
    assert memory.summary["canonical_path"] == "in-memory" and "link_split_chunks" not in memory.summary
    assert stream.summary["canonical_path"] == "external sort" and stream.summary["link_split_chunks"] > 1
    assert stream.summary["directed"] is (kind == "files-directed")
    assert stream.key == memory.key
    assert stream.summary["edge_split_sizes"]["valid"] > 0
    assert chunk_files(tmp_path / "memory") == chunk_files(tmp_path / "stream")


def test_the_link_minimum_holds_the_held_out_pairs(tmp_path: Path) -> None:
    path = str(_files_dataset(tmp_path / "data"))
    budget = MemoryBudget(3 << 20, "download", "memory_budget_bytes")
    node = choose(download.Params(dataset="files", path=path), budget)
    params = download.Params(dataset="files", path=path, task="link", link_split=(0.8, 0.05, 0.15))
    link = choose(params, budget)
    assert node.streamed and link.streamed
    assert link.minimum - node.minimum >= 0.2 * 100_000 * HELD_PAIR_BYTES   # at most one pair per listed edge
    with pytest.raises(InputError, match=r"held-out valid/test edges.* raise memory_budget_bytes to"):
        choose(params, MemoryBudget(link.minimum - 1, "download", "memory_budget_bytes"))


def test_a_full_disk_during_the_link_split_leaves_nothing_half_written(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls = disk_full_after(3, monkeypatch, "link-")   # the split's spills only: the sort before it completes
    root = tmp_path / "root"
    params = download.Params(dataset="files", path=str(_files_dataset(tmp_path / "data")), task="link",
                             memory_budget_bytes=3 << 20)
    with pytest.raises(StoreWriteError, match=r"^download stage: cannot write to .*No space left on device"):
        download.run(ArtifactStore(root), params, {}, progress=False)
    assert len(calls) == 4 and not leftovers(root) and not (root / "download").exists()


def test_a_wrong_link_edge_type_fails_before_the_sort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spilled = disk_full_after(1 << 30, monkeypatch)   # records every spill, fails none
    params = download.Params(dataset="files", path=str(_files_dataset(tmp_path / "data")), task="link",
                             link_edge_type="cites", memory_budget_bytes=3 << 20)
    with pytest.raises(InputError, match=r"link_edge_type.*cites") as err:
        download.run(ArtifactStore(tmp_path / "root"), params, {}, progress=False)
    assert "\n" not in str(err.value) and spilled == [] and not (tmp_path / "root" / "download").exists()
