"""Hotness past its memory budget: the whole-graph CSR mapped from spill files plans exactly what the in-memory one
plans (node and link tasks, a typed graph); a budget below the stage's O(N) minimum fails in one line before
anything is written; and an int32 CSR samples the batches an int64 one does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stages.hotness import stage as hotness
from stages.hotness.whole_csr import CsrLayout
from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from storage import ArtifactStore, InputError, Manifest
from storage.partition import PartitionArtifact
from tests._sampler_graphs import power_law_graph
from tests._train_pipeline import build_without_prefect
from tests.conftest import artifact_files

# 20 000 nodes: the stage's O(N) minimum (~3 MiB) is above memory_budget_bytes' least value (1 MiB), so a budget
# can be too small; 64 MiB is above that minimum and below the interpreter's own anonymous memory, so the
# in-memory CSR never fits it and the mapped path runs
NUM_NODES = 20_000
MAPPED_BUDGET = 64 << 20
TOO_SMALL = 1 << 20


def _upstream(root: Path, **values: Any) -> tuple[ArtifactStore, dict[str, Manifest]]:
    return build_without_prefect({"artifacts": str(root), "num_nodes": NUM_NODES, "num_features": 8,
                                  "num_classes": 4, "num_partitions": 3, "until": "features", **values})


def _plan_files(store: ArtifactStore, m: Manifest) -> dict[str, bytes]:
    """The hot-<p>.zarr stores' files (chunks and metadata), by relative path."""
    return {rel: data for rel, data in artifact_files(store, m).items() if rel.startswith("hot-")}


def _figures(m: Manifest) -> dict[str, Any]:
    """The summary without what describes the run (cost, budget, where the CSR lived)."""
    drop = {"wall_s", "peak_rss_bytes", "peak_rss_source", "start_rss_bytes", "peak_anon_bytes", "memory_budget",
            "csr", "base_anon_bytes"}
    return {k: v for k, v in m.summary.items() if k not in drop}


def _check_mapped_equals_default(tmp_path: Path, params: dict[str, Any], **graph: Any) -> None:
    store, m = _upstream(tmp_path, **graph)
    upstream = {"partition": m["partition"], "features": m["features"]}
    default = hotness.run(store, hotness.Params(**params), upstream, progress=False)
    assert "in memory" in default.summary["csr"]
    plans = _plan_files(store, default)   # before force rebuilds the key in place
    mapped = hotness.run(store, hotness.Params(memory_budget_bytes=MAPPED_BUDGET, **params), upstream,
                         progress=False, force=True)
    assert mapped.key == default.key and "memory-mapped" in mapped.summary["csr"]
    assert _figures(mapped) == _figures(default)
    assert "Sampled from" in hotness.report(mapped).markdown and "memory-mapped" in hotness.report(mapped).markdown
    assert plans and _plan_files(store, mapped) == plans
    assert not [n for n in os.listdir(os.path.join(store.root, "hotness")) if n.startswith(".tmp")], "scratch left"


def test_mapped_node_task_plans_what_memory_plans(tmp_path):
    _check_mapped_equals_default(tmp_path, {"fanouts": (10, 5), "batch_size": 256})


def test_mapped_link_task_plans_what_memory_plans(tmp_path):
    _check_mapped_equals_default(tmp_path, {"fanouts": (5, 5), "batch_size": 256, "task": "link",
                                            "edges_per_epoch": 2048},
                                 dataset="synthetic-link", task="link", avg_degree=6.0)


def test_mapped_typed_graph_plans_what_memory_plans(tmp_path):
    _check_mapped_equals_default(tmp_path, {"fanouts": (5, 3), "batch_size": 256}, dataset="synthetic-hetero")


def test_budget_below_the_minimum_is_one_line_and_writes_nothing(tmp_path):
    store, m = _upstream(tmp_path)
    layout = CsrLayout.of(PartitionArtifact(store, m["partition"]))
    assert layout.minimum() > TOO_SMALL
    with pytest.raises(InputError) as err:
        hotness.run(store, hotness.Params(memory_budget_bytes=TOO_SMALL),
                    {"partition": m["partition"], "features": m["features"]}, progress=False)
    line = str(err.value)
    assert "\n" not in line and f"raise memory_budget_bytes to {layout.minimum()}" in line, line
    assert f"{NUM_NODES:,} nodes" in line
    assert not os.path.exists(os.path.join(store.root, "hotness"))


def _batches(csr: LocalCSR, fanouts: list[Any], seeds: torch.Tensor, *, replace: bool = False) -> list[Any]:
    sampler = NeighborSampler(csr, fanouts, replace=replace, generator=torch.Generator().manual_seed(3))
    order = torch.Generator().manual_seed(4)
    return [sampler.sample(b) for b in iter_seed_batches(seeds, 64, generator=order)]


def _assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.n_id.dtype == y.n_id.dtype == torch.long
        assert torch.equal(x.n_id, y.n_id) and torch.equal(x.edge_index, y.edge_index)
        assert x.num_sampled_nodes == y.num_sampled_nodes
        if "edge_type" in y:
            assert torch.equal(x.edge_type, y.edge_type)


@pytest.mark.parametrize("replace", [False, True])
def test_int32_csr_samples_the_int64_batches(replace):
    indptr, indices = power_law_graph(3000, 12.0, seed=2)
    wide = LocalCSR.from_numpy(indptr, indices.astype(np.int64))
    narrow = LocalCSR.from_numpy(indptr, indices.astype(np.int32))
    assert narrow.indices.dtype == torch.int32 and wide.indices.dtype == torch.int64
    seeds = torch.arange(0, 3000, 7)
    _assert_same(_batches(narrow, [10, 5], seeds, replace=replace), _batches(wide, [10, 5], seeds, replace=replace))
    weight = torch.rand(indices.shape[0], generator=torch.Generator().manual_seed(1))
    _assert_same(_batches(narrow.with_edge_weight(weight), [4, 3], seeds, replace=replace),
                 _batches(wide.with_edge_weight(weight), [4, 3], seeds, replace=replace))


def test_int32_typed_csr_samples_the_int64_batches():
    from tests._typed_worker import typed_graph

    graph = typed_graph()
    r = graph.schema.num_edge_types
    wide = LocalCSR.from_numpy(graph.indptr, graph.indices.astype(np.int64), num_edge_types=r)
    narrow = LocalCSR.from_numpy(graph.indptr, graph.indices.astype(np.int32), num_edge_types=r)
    seeds = torch.arange(graph.schema.num_nodes)
    for fanouts in ([3, 2], [tuple(range(1, r + 1)), -1]):
        _assert_same(_batches(narrow, fanouts, seeds), _batches(wide, fanouts, seeds))
