"""The download stage under a memory budget: the external sort builds the in-memory path's CSR, a streamed build
writes the same bytes under the same key, a too-small budget or a full disk leaves nothing behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.canonical import to_csr_incoming
from stages.download.external_sort import array_chunks, csr_chunks, external_csr
from storage import ArtifactStore, InputError
from storage.graph import GraphArtifact
from storage.write_errors import StoreWriteError


def _edges(rng: np.random.Generator, n: int, e: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Random edges among the first half of the nodes (the rest: empty rows), with self-loops and duplicates."""
    src: np.ndarray = rng.integers(0, n // 2, e).astype(dtype)
    dst: np.ndarray = rng.integers(0, n // 2, e).astype(dtype)
    src[:40] = dst[:40]                       # self-loops
    src[40:80], dst[40:80] = src[80:120], dst[80:120]   # duplicates
    return src, dst


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_external_sort_matches_the_in_memory_csr(tmp_path: Path, directed: bool, dtype: type) -> None:
    src, dst = _edges(np.random.default_rng(0), 600, 5000, dtype)
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


SYNTHETIC = {"dataset": "synthetic", "num_nodes": 20_000, "avg_degree": 10.0, "num_features": 6, "num_classes": 4}


def _files_dataset(d: Path, n: int = 3000, e: int = 100_000) -> Path:
    rng = np.random.default_rng(1)
    d.mkdir()
    src, dst = _edges(rng, n, e, np.int64)
    np.save(d / "edge_index.npy", np.stack([src, dst]))
    np.save(d / "x.npy", rng.standard_normal((n, 5)).astype(np.float32))
    np.save(d / "y.npy", rng.integers(0, 3, n))
    order = rng.permutation(n)
    for name, part in zip(("train", "valid", "test"), np.split(order, [n // 2, 3 * n // 4]), strict=True):
        np.save(d / f"{name}_idx.npy", part)
    return d


def _chunk_files(root: Path) -> dict[str, bytes]:
    graph = next(root.glob("download/*/graph.zarr"))
    return {str(p.relative_to(graph)): p.read_bytes() for p in sorted(graph.rglob("*")) if p.is_file()}


def _leftovers(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name or "scratch" in p.name]


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
        assert not _leftovers(tmp_path / name)
    memory, stream = built["memory"], built["stream"]
    assert memory.summary["canonical_path"] == "in-memory"
    assert stream.summary["canonical_path"] == "external sort" and stream.summary["sort_buckets"] > 1
    assert stream.summary["memory_budget_bytes"] == budget and stream.summary["spill_bytes"] > 0
    assert stream.key == memory.key
    assert _chunk_files(tmp_path / "memory") == _chunk_files(tmp_path / "stream")
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


def disk_full_after(writes: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Spill appends fail with ENOSPC after ``writes`` of them; returns the paths appended to (the failing one
    last)."""
    calls = []

    def full(path: str, data: np.ndarray) -> None:
        calls.append(path)
        if len(calls) > writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        with open(path, "ab") as f:
            data.tofile(f)

    monkeypatch.setattr("storage.spill.spill_append", full)
    return calls


def test_a_full_disk_during_a_spill_leaves_nothing_half_written(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    disk_full_after(3, monkeypatch)
    root = tmp_path / "root"
    params = download.Params(dataset="files", path=str(_files_dataset(tmp_path / "data")),
                             memory_budget_bytes=3 << 20)
    with pytest.raises(StoreWriteError, match=r"^download stage: cannot write to .*No space left on device"):
        download.run(ArtifactStore(root), params, {}, progress=False)
    assert not _leftovers(root) and not (root / "download").exists()
