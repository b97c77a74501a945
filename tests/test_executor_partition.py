"""The partition stage's part writes as executor units (``stages.partition.units``): built on the session's Dask
cluster of 2 worker processes, the artifact has the key, the files and every byte of the one built in-process, on
the in-memory path and on the streamed path alike, for a node graph, a typed graph and link graphs (edge splits,
edge attributes, fixed negatives); a unit rerun over a half-written part leaves the same bytes; a budget whose
share cannot hold a unit fails in one line before anything is written."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flows.direct import run_stages
from stages.partition import footprint, units
from stages.partition import stage as partition
from storage import ArtifactStore, InputError, Manifest
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact, write_book
from storage.writer import WorkDir
from tests import ogbl_fixture
from tests.conftest import TINY, artifact_files

# 3 parts on 2 workers: one unit writes two parts, the other one
PARTS = 3
GRAPHS: dict[str, dict[str, Any]] = {
    "node": TINY,
    # 400 nodes: 2 institutions for 3 parts, so a part owns no node of that type (tests/test_features_stream.py)
    "typed": {"dataset": "synthetic-hetero", "num_nodes": 400, "num_features": 6, "num_classes": 4},
    # edge splits and edge attributes per part
    "link": {**TINY, "task": "link", "num_edge_features": 3},
    # per-positive fixed evaluation negatives per part
    "ogbl": {"dataset": "ogbl-citation2", "task": "link"},
}
# the figures of the build itself: its time and memory, and on Dask its executor's
OWN = {"wall_s", "peak_rss_bytes", "peak_rss_source", "start_rss_bytes", "peak_anon_bytes", "executor_slots",
       "units"}


def _download(root: Path, graph: str) -> tuple[ArtifactStore, Manifest]:
    values = dict(GRAPHS[graph])
    if values["dataset"].startswith("ogbl"):
        values["download.download_dir"] = str(ogbl_fixture.build(values["dataset"], root / "ogb").root)
    store, built = run_stages({**values, "num_partitions": PARTS, "artifacts": str(root / "art"),
                               "until": "download"})
    return store, built["download"]


def _same(store: ArtifactStore, got: Manifest, want: Manifest, want_files: dict[str, bytes]) -> None:
    assert got.key == want.key and got.build_id != want.build_id
    files = artifact_files(store, got)
    assert sorted(files) == sorted(want_files)
    assert [f for f in files if files[f] != want_files[f]] == []
    assert any(f.endswith("/c/0") for f in files)   # chunk files compared, not only metadata
    assert got.files == want.files and got.digests == want.digests


@pytest.mark.slow
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_dask_parts_are_byte_identical(graph: str, tmp_path: Path, dask_cluster: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """In memory, streamed and on Dask: one key, the same files and bytes; the summaries differ only in the
    build's own figures (and the memory path)."""
    store, dl = _download(tmp_path, graph)
    params = partition.Params(num_partitions=PARTS)
    local = partition.run(store, params, {"download": dl}, progress=False)
    assert local.summary["memory_path"] == "in-memory"
    want = artifact_files(store, local)
    plan = partition.memory_plan(GraphArtifact(store, dl), params)
    if plan.in_memory > 1 << 20:   # a budget that forces the streamed path
        streamed = partition.run(store, params.model_copy(update={"memory_budget_bytes": max(plan.minimum, 1 << 20)}),
                                 {"download": dl}, force=True, progress=False)
    else:   # 24 nodes: no budget (at least 1 MiB) is below the in-memory estimate, so the plan is told to stream
        monkeypatch.setattr(partition, "memory_plan", lambda artifact, p: replace(plan, streamed=True))
        streamed = partition.run(store, params, {"download": dl}, force=True, progress=False)
        monkeypatch.undo()
    assert streamed.summary["memory_path"] == "streamed"
    _same(store, streamed, local, want)
    got = partition.run(store, params.model_copy(update={"executor": dask_cluster}), {"download": dl},
                        force=True, progress=False)
    _same(store, got, local, want)
    s = got.summary
    assert s["executor_slots"] == 2 and [u["parts"] for u in s["units"]] == [[0, 1], [2]]
    assert all(u["wall_s"] > 0 for u in s["units"])
    assert {k: v for k, v in s.items() if k not in OWN} == {k: v for k, v in local.summary.items() if k not in OWN}
    if graph in ("link", "ogbl"):
        assert len(s["edge_split_sizes"]) == PARTS and s["edge_split_sizes"] != [{}] * PARTS
    if graph == "ogbl":
        assert s["link_eval"] == "per-positive" and len(s["edge_split_neg_shapes"]) == PARTS


def _work_dir(root: Path, store: ArtifactStore, built: Manifest) -> WorkDir:
    """A work directory holding the artifact's book only, as the stage leaves it for its units."""
    out = WorkDir(str(root / "work"), True, "partition", built.key)
    os.makedirs(out.url)
    write_book(out, PartitionArtifact(store, built).book(), {})
    return out


def _parts(directory: str) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(d, n), directory): Path(d, n).read_bytes()
            for d, _, names in os.walk(directory) for n in names if not os.path.relpath(d, directory).startswith(
                "book.zarr")}


def test_a_rerun_unit_writes_over_a_half_written_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit that died in the middle of a part (a killed worker), run again as Dask reschedules it, leaves the
    bytes of the one-process build: no file of the first try survives, stray or stale."""
    import storage.partition_stream as stream

    store, dl = _download(tmp_path, "link")
    built = partition.run(store, partition.Params(num_partitions=PARTS), {"download": dl}, progress=False)
    want = {k: v for k, v in artifact_files(store, built).items() if not k.startswith("book.zarr")}
    out = _work_dir(tmp_path, store, built)
    job = units.PartsJob(store.root, dl, out, (1, 2))
    real = stream.ChunkAppender.close

    def dies(self: Any) -> None:   # the first part's indices written, then the worker is gone
        real(self)
        raise KeyboardInterrupt("worker killed")

    monkeypatch.setattr(stream.ChunkAppender, "close", dies)
    with pytest.raises(KeyboardInterrupt):
        units.write_parts(job)
    monkeypatch.undo()
    half = _parts(out.url)
    assert half and all(k.startswith("part-1.zarr") for k in half)
    Path(out.url, "part-2.zarr").mkdir()
    Path(out.url, "part-2.zarr", "stale").write_bytes(b"from a first try")
    result = units.write_parts(job)
    assert units.write_parts(units.PartsJob(store.root, dl, out, (0,)))["parts"] == [0]
    assert result["parts"] == [1, 2] and len(result["link_sizes"]) == 2
    assert _parts(out.url) == want
    assert [n for n in os.listdir(tmp_path / "work") if "scratch" in n] == []   # not the work dir's either
    assert [n for n in os.listdir(tmp_path) if "scratch" in n] == []


def test_unit_estimate() -> None:
    need = footprint.unit_minimum(num_nodes=1000, num_entries=10_000, num_parts=4, num_edge_types=1)
    assert need == 24 * 1000 + 40 * 500 + 10_000 + 40 * 5000 + 4 * 5000
    assert footprint.unit_minimum(num_nodes=1000, num_entries=10_000, num_parts=4, num_edge_types=2,
                                  edge_attr_bytes=12 * 10_000) - need == 40 * 500 + (64 + 24 - 40) * 5000


@pytest.mark.slow
def test_a_share_too_small_fails_before_any_write(tmp_path: Path, dask_cluster: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage's plan fits the budget, but half of it cannot hold a unit: one line, before the partitioner runs
    and before any directory is made."""
    store, dl = _download(tmp_path, "node")
    params = partition.Params(num_partitions=PARTS, executor=dask_cluster, memory_budget_bytes=1 << 30)
    monkeypatch.setattr(partition, "unit_memory", lambda artifact, p: (1 << 29) + 1)
    with pytest.raises(InputError, match=r"partition needs at least .* for 2 units that each hold the partition "
                                         rf"book.* raise memory_budget_bytes to {(1 << 30) + 2} or more") as err:
        partition.run(store, params, {"download": dl}, progress=False)
    assert "\n" not in str(err.value)
    assert not os.path.exists(os.path.join(store.root, "partition"))
