"""The external sort's buckets and inference's exports as executor units (``stages.sort_units``,
``stages.infer.export_units``): the same bytes under the same key on a real 2-worker ``distributed`` cluster as in
one process, and a unit run again (a rerun after a killed worker) leaves the same bytes."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import pytest

from flows.config import make_config, stage_keys
from flows.direct import run_stages
from stages.download import stage as download
from stages.executor import Executor
from stages.external_sort import array_chunks, external_csr
from stages.infer import params as infer_params
from stages.infer.export_units import export_on, labels_and_splits
from stages.sort_units import BucketJob, sort_bucket, sort_executor
from storage import ArtifactStore, infer_export
from storage.features import FeaturesArtifact
from storage.infer import open_part_outputs, write_part_embedding, write_part_link_embeddings, write_part_predictions
from storage.partition import PartitionArtifact
from tests._download_cases import HETERO, SYNTHETIC, leftovers, messy_edges, streaming_minimum
from tests.conftest import TINY, artifact_files

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
    src, dst = messy_edges(np.random.default_rng(0), 600, 5000, np.int64)
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


def test_where_the_sort_runs_its_buckets(tmp_path: Path) -> None:
    """``local`` opens nothing; on an object-store root the sort spills to this host's $TMPDIR, which a remote
    scheduler's workers may not see: its buckets are sorted in this process, said in the summary."""
    with sort_executor("local", ArtifactStore(tmp_path)) as (executor, placed):
        assert executor is None and placed == {}
    with sort_executor("tcp://10.0.0.5:8786", ArtifactStore("memory://gnnpipe-sort")) as (executor, placed):
        assert executor is None and "sorted in this process" in placed["sort_units_local"]


def test_the_flat_executor_name_reaches_infer_and_no_key() -> None:
    cfg = make_config(TINY, executor="tcp://10.0.0.5:8786")
    assert cfg.infer.executor == "tcp://10.0.0.5:8786" and "executor" in infer_params.Params.runtime_fields()
    assert stage_keys(cfg) == stage_keys(make_config(TINY))


def _download(root: Path, params: dict[str, Any], budget: int, executor: str) -> Any:
    store = ArtifactStore(root)
    manifest = download.run(store, download.Params(**params, memory_budget_bytes=budget, executor=executor), {},
                            progress=False)
    assert not leftovers(root)
    return store, manifest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["synthetic", "synthetic-hetero"])
def test_streamed_download_on_dask_is_byte_identical(tmp_path: Path, dask_cluster: str, kind: str) -> None:
    """The streamed path (a budget below the in-memory estimate) with its buckets on the cluster: the key and
    every byte of the one sorted in-process."""
    params, budget = (SYNTHETIC, 5 << 20) if kind == "synthetic" else (HETERO, streaming_minimum(HETERO) + (256 << 10))
    store, local = _download(tmp_path / "local", params, budget, "local")
    dask_store, dask = _download(tmp_path / "dask", params, budget, dask_cluster)
    assert local.summary["canonical_path"] == dask.summary["canonical_path"] == "external sort"
    assert "sort_units" not in local.summary and "executor_slots" not in local.summary
    assert dask.summary["executor_slots"] == 2 and dask.summary["sort_units"] == dask.summary["sort_buckets"] > 1
    assert dask.key == local.key
    assert artifact_files(dask_store, dask) == artifact_files(store, local)
    assert dask.files == local.files and dask.digests == local.digests


@dataclass(frozen=True)
class Out:
    """Where an export writes (``StageWriter``'s ``url`` and ``file_url``): a folder of ranks' outputs."""

    url: str

    def file_url(self, rel: str) -> str:
        return f"{self.url}/{rel}"


def _rank_outputs(store: ArtifactStore, partition: Any, folder: Path, link: bool) -> list[int]:
    """Random ``part-<p>.zarr`` outputs of a 2-layer model with 3 classes (``link``: a link model's 5-wide
    embeddings) in ``folder``, as the ranks write them; returns the embedding layers."""
    book = PartitionArtifact(store, partition).book()
    rng = np.random.default_rng(3)
    for p in range(book.num_partitions):
        start, n = int(book.bounds[p]), int(book.bounds[p + 1] - book.bounds[p])
        group = open_part_outputs(str(folder), p)
        write_part_embedding(group, 0, rng.standard_normal((n, 6)))
        if link:
            write_part_link_embeddings(group, part=p, start_gid=start, emb=rng.standard_normal((n, 5)),
                                       embedding_layers=[0])
        else:
            prob = rng.random((n, 3)).astype(np.float32)
            write_part_predictions(group, part=p, start_gid=start, pred=prob.argmax(1), prob=prob,
                                   embedding_layers=[0])
    return [0]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("dataset, link", [("synthetic", False), ("synthetic-hetero", False), ("synthetic", True)])
def test_infer_exports_on_dask_are_byte_identical(tmp_path: Path, dask_cluster: str, dataset: str,
                                                  link: bool) -> None:
    """The same ranks' outputs exported in this process (as the stage with ``executor=local``) and by units on the
    cluster, in 5 chunks (the last one short) over 2 units: every byte of the parts and the exports."""
    store, built = run_stages({**TINY, "dataset": dataset, "artifacts": str(tmp_path / "root"), "until": "features"})
    partition, features = built["partition"], built["features"]
    parts = PartitionArtifact(store, partition)
    book = parts.book()
    rows = book.num_nodes // 5 + 7   # 5 chunks, the last one short
    outs = {name: Out(str(tmp_path / name)) for name in ("local", "dask")}
    layers = {name: _rank_outputs(store, partition, Path(out.url), link) for name, out in outs.items()}
    if link:
        infer_export.export_link_embeddings(cast(Any, outs["local"]), book=book, embedding_layers=layers["local"],
                                            schema=parts.schema, chunk_rows=rows)
    else:
        label, split = labels_and_splits(FeaturesArtifact(store, features), book.num_partitions)
        infer_export.export_orig_order(cast(Any, outs["local"]), book=book, label_of_gid=label, split_of_gid=split,
                                       num_classes=3, embedding_layers=layers["local"], schema=parts.schema,
                                       chunk_rows=rows)
    with pytest.MonkeyPatch.context() as mp:   # the plan is made here: its rows are the units'
        mp.setattr(infer_export, "export_rows", lambda *_: rows)
        figures = export_on(dask_cluster, store, cast(Any, outs["dask"]), partition=partition,
                            features=None if link else features, num_classes=3, embedding_layers=layers["dask"])
    assert figures["export_executor_slots"] == 2
    assert [u["chunks"] for u in figures["export_units"]] == [[0, 1, 2], [3, 4]]
    want = _files(tmp_path / "local")
    assert ("predictions.parquet" in want) != link and any(f.startswith("nodes.zarr/emb/") for f in want)
    assert any(f.startswith("nodes.zarr/node_type/") for f in want) == (dataset != "synthetic")
    assert _files(tmp_path / "dask") == want
