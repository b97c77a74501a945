"""The hotness stage's units (``stages.hotness.units``) on a real ``distributed`` cluster of 2 worker processes:
the artifact has the key, files and digests of the one planned in-process, for a homogeneous graph (its units'
CSRs mapped from their own scratch), a typed graph and task=link; so a part's seeded generators draw the same
samples in another process. A budget whose per-unit share is below the stage's minimum fails in one line; a unit
rerun over what a killed try left writes the same bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from stages.hotness import stage as hotness
from stages.hotness.units import PlanJob, plan_parts
from stages.hotness.whole_csr import CsrLayout
from stages.memory import MemoryBudget
from storage import ArtifactStore, InputError, Manifest
from storage.partition import PartitionArtifact
from storage.writer import WorkDir
from tests._train_pipeline import build_without_prefect
from tests.conftest import artifact_files

# 3 parts on 2 workers: one unit plans two parts, the other one. 6 000 nodes: the stage's O(N) minimum (~0.9 MiB)
# is near memory_budget_bytes' least value (1 MiB), so a budget can hold it once but not twice
GRAPH: dict[str, Any] = {"num_nodes": 6000, "num_features": 8, "num_classes": 4, "num_partitions": 3}
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {   # graph values, hotness params
    "node": ({}, {"fanouts": (10, 5), "batch_size": 256}),
    "typed": ({"dataset": "synthetic-hetero", "num_nodes": 3000}, {"fanouts": (5, 3), "batch_size": 256}),
    "link": ({"dataset": "synthetic-link", "task": "link", "avg_degree": 6.0, "num_nodes": 3000},
             {"fanouts": (5, 5), "batch_size": 256, "task": "link", "edges_per_epoch": 2048}),
}
# a share of 64 MiB is below a worker's own anonymous memory (the interpreter and torch), so each unit maps its CSR
MAPPED_BUDGET = 2 * (64 << 20)


def _upstream(root: Path, case: str) -> tuple[ArtifactStore, dict[str, Manifest]]:
    graph, params = CASES[case]
    return build_without_prefect({"artifacts": str(root), **GRAPH, **graph, **params, "until": "hotness"})


def _upstream_of(built: dict[str, Manifest]) -> dict[str, Manifest]:
    return {name: built[name] for name in hotness.UPSTREAM}


def _plan_files(store: ArtifactStore, m: Manifest) -> dict[str, bytes]:
    return {rel: data for rel, data in artifact_files(store, m).items() if rel.startswith("hot-")}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_dask_hotness_is_byte_identical(tmp_path: Path, dask_cluster: str, case: str) -> None:
    store, built = _upstream(tmp_path, case)
    local = built["hotness"]
    want = artifact_files(store, local)   # before force rebuilds the key in place
    budget = {"memory_budget_bytes": MAPPED_BUDGET} if case == "node" else {}
    params = hotness.Params(**{**local.params, **budget, "executor": dask_cluster})
    got = hotness.run(store, params, _upstream_of(built), force=True, progress=False)
    assert got.key == local.key and got.build_id != local.build_id
    files = artifact_files(store, got)
    assert sorted(files) == sorted(want) and [f for f in files if files[f] != want[f]] == []
    assert got.files == local.files and got.digests == local.digests
    s = got.summary
    for field in ("num_partitions", "parts", "curves", "fanouts", "epochs", "budget"):
        assert s[field] == local.summary[field], field
    assert s["executor_slots"] == 2 and [u["parts"] for u in s["units"]] == [[0, 1], [2]]
    assert [u["csr_mapped"] for u in s["units"]] == [case == "node"] * 2
    assert ("memory-mapped" in s["csr"]) == (case == "node") and "1/2 of" in s["memory_budget"]
    assert not [n for n in os.listdir(Path(store.root) / "hotness") if n.startswith(".tmp")], "scratch left"


@pytest.mark.slow
def test_share_below_the_minimum_is_one_line(tmp_path: Path, dask_cluster: str) -> None:
    """A budget that holds the minimum once, split over 2 units that each assemble the CSR: one line, no write."""
    store, built = build_without_prefect({"artifacts": str(tmp_path), **GRAPH, "until": "features"})
    minimum = CsrLayout.of(PartitionArtifact(store, built["partition"])).minimum()
    budget = max(1 << 20, minimum)
    assert budget < 2 * minimum
    params = hotness.Params(memory_budget_bytes=budget, executor=dask_cluster)
    with pytest.raises(InputError, match=rf"for 2 units that each hold the O\(N\) arrays of 6,000 nodes .*"
                       rf"raise memory_budget_bytes to {2 * minimum} or more") as err:
        hotness.run(store, params, _upstream_of(built), progress=False)
    assert "\n" not in str(err.value)
    assert not (Path(store.root) / "hotness").exists()


def test_unit_rerun_over_a_killed_try_writes_the_same_bytes(tmp_path: Path) -> None:
    """What a worker killed mid-unit leaves (a truncated chunk, a stray chunk, a store without its metadata) is
    replaced whole by the rerun: the same files and bytes as the stage's own build."""
    store, built = _upstream(tmp_path / "a", "node")
    local = built["hotness"]
    out = WorkDir(str(tmp_path / "work"), True, "hotness", local.key)
    job = PlanJob(store.root, built["partition"], built["features"], out, (0, 1),
                  hotness.Params(**local.params), MemoryBudget(1 << 30, "hotness", "test"))
    first = plan_parts(job)
    work = tmp_path / "work"
    want = {str(f.relative_to(work)): f.read_bytes() for f in sorted(work.rglob("*")) if f.is_file()}
    assert want == {rel: data for rel, data in _plan_files(store, local).items() if rel.startswith(("hot-0", "hot-1"))}
    chunk = next(p for p in sorted(work.glob("hot-0.zarr/gid/c/*")) if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:5])
    (chunk.parent / "99").write_bytes(b"left by the killed try")
    (work / "hot-1.zarr" / "zarr.json").unlink()
    again = plan_parts(job)
    got = {str(f.relative_to(work)): f.read_bytes() for f in sorted(work.rglob("*")) if f.is_file()}
    assert got == want
    assert again["rows"] == first["rows"] and again["curves"] == first["curves"]
    assert [n for n in os.listdir(tmp_path) if "scratch" in n] == []
