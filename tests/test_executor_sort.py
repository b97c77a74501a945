"""The external sort's buckets and inference's exports as executor units (``stages.sort_units``,
``stages.infer.export_units``): the same bytes under the same key on a real 2-worker ``distributed`` cluster as in
one process, and a unit run again (a rerun after a killed worker) leaves the same bytes."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from stages.download import stage as download
from stages.executor import Executor
from stages.external_sort import array_chunks, external_csr
from stages.sort_units import BucketJob, sort_bucket
from storage import ArtifactStore
from tests.conftest import artifact_files
from tests.test_download_stream import SYNTHETIC, _edges, _leftovers
from tests.test_download_stream_typed import HETERO, _minimum

U = TypeVar("U")
R = TypeVar("R")


class TwiceExecutor(Executor):
    """Runs every unit twice, in reverse order: a unit rerun after its worker died, finding its own output."""

    slots = 3

    def map(self, fn: Callable[[U], R], units: Sequence[U], *, name: str) -> list[R]:
        first = [fn(unit) for unit in reversed(units)][::-1]
        again = [fn(unit) for unit in units]
        assert [_figures(r) for r in first] == [_figures(r) for r in again]
        return again


def _figures(result: Any) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "wall_s"}


@pytest.mark.parametrize("directed", [False, True])
def test_bucket_units_build_the_local_sorts_bytes(tmp_path: Path, directed: bool) -> None:
    src, dst = _edges(np.random.default_rng(0), 600, 5000, np.int64)
    (tmp_path / "local").mkdir()
    (tmp_path / "units").mkdir()
    want = external_csr(array_chunks(src, dst, 777), 600, symmetrise=not directed, budget_bytes=120_000,
                        scratch=str(tmp_path / "local"))
    got = external_csr(array_chunks(src, dst, 777), 600, symmetrise=not directed, budget_bytes=120_000,
                       scratch=str(tmp_path / "units"), executor=TwiceExecutor())
    assert got.units == got.buckets > want.buckets > 1   # a third of the budget per bucket: more buckets
    assert np.array_equal(got.indptr, want.indptr)
    assert (tmp_path / "units" / "indices.raw").read_bytes() == (tmp_path / "local" / "indices.raw").read_bytes()
    assert sorted(os.listdir(tmp_path / "units")) == ["indices.raw"]   # keys, pieces and counts removed


def test_a_bucket_whose_keys_went_before_it_finished_fails_clearly(tmp_path: Path) -> None:
    job = BucketJob(3, str(tmp_path / "bucket-00003.keys"), 0, 10, 10, has_keys=True)
    with pytest.raises(FileNotFoundError, match="the keys of bucket 3 .* are gone before it was sorted"):
        sort_bucket(job)


def _download(root: Path, params: dict[str, Any], budget: int, executor: str) -> Any:
    store = ArtifactStore(root)
    manifest = download.run(store, download.Params(**params, memory_budget_bytes=budget, executor=executor), {},
                            progress=False)
    assert not _leftovers(root)
    return store, manifest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["synthetic", "synthetic-hetero"])
def test_streamed_download_on_dask_is_byte_identical(tmp_path: Path, dask_cluster: str, kind: str) -> None:
    """The streamed path (a budget below the in-memory estimate) with its buckets on the cluster: the key and
    every byte of the one sorted in-process."""
    params, budget = (SYNTHETIC, 5 << 20) if kind == "synthetic" else (HETERO, _minimum(HETERO) + (256 << 10))
    store, local = _download(tmp_path / "local", params, budget, "local")
    dask_store, dask = _download(tmp_path / "dask", params, budget, dask_cluster)
    assert local.summary["canonical_path"] == dask.summary["canonical_path"] == "external sort"
    assert "sort_units" not in local.summary and "executor_slots" not in local.summary
    assert dask.summary["executor_slots"] == 2 and dask.summary["sort_units"] == dask.summary["sort_buckets"] > 1
    assert dask.key == local.key
    assert artifact_files(dask_store, dask) == artifact_files(store, local)
    assert dask.files == local.files and dask.digests == local.digests
