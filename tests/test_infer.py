"""The infer stage end to end: exact distributed inference equals the model's forward pass on the whole graph (same
weights, float reassociation apart), every orig id exported once and in order, the stage cached, a plug-in model.
The computation's pieces in one process (no torchrun) are ``test_infer_layerwise.py``'s."""

from __future__ import annotations

import numpy as np
import pytest

from stages.infer import stage as infer
from stages.infer.params import Params
from storage import ArtifactStore, Manifest
from storage.graph import SPLITS
from storage.infer_artifact import InferArtifact
from storage.leftovers import infer_job_dir
from storage.train_summary import TrainSummary
from tests._infer_cases import Case, check_against_reference, run_case
from tests.conftest import artifact_files

# ---- end to end: torchrun ranks, then the export ----------------------------------------------------------------



@pytest.fixture(scope="module")
def sage2(tmp_path_factory: pytest.TempPathFactory) -> Case:
    """GraphSAGE, 2 layers, 2 partitions; chunks of ~2 000 edges (several per rank and layer)."""
    return run_case(str(tmp_path_factory.mktemp("sage2")), 2, {"chunk_edges": 2000})


@pytest.fixture(scope="module")
def gcn3(tmp_path_factory: pytest.TempPathFactory) -> Case:
    """GCN (true degrees), 3 layers, 3 partitions, every hidden layer stored; ranks with unequal chunk counts."""
    return run_case(str(tmp_path_factory.mktemp("gcn3")), 3, {"chunk_edges": 1500, "embeddings": "all"},
                 model="gcn", fanouts=(5, 5, 5))


@pytest.fixture(scope="module")
def gat2(tmp_path_factory: pytest.TempPathFactory) -> Case:
    """GAT (a conv that adds self loops by position): the per-chunk gather path, 2 partitions."""
    return run_case(str(tmp_path_factory.mktemp("gat2")), 2, {"chunk_edges": 2500}, model="gat")


@pytest.fixture(scope="module")
def plugin2(tmp_path_factory: pytest.TempPathFactory) -> Case:
    """The README's plug-in (a plain PyG model with a skip connection): the whole model per chunk's 2-hop
    neighbourhood."""
    return run_case(str(tmp_path_factory.mktemp("plugin2")), 2, {"chunk_edges": 3000},
                 model="examples.custom_model:build")





@pytest.mark.slow
def test_exact_inference_on_two_partitions_equals_the_whole_graph_sage(sage2: Case):
    check_against_reference(sage2, layers=[0])
    s = sage2.manifest.summary
    assert s["mode"] == "exact" and s["path"] == "layer-wise (layer matrices and halo)" and s["num_partitions"] == 2
    assert all(r["chunks"] > 1 and r["remote_mib"] > 0 and r["peak_rss_mib"] > 0 for r in s["ranks"])
    assert all(r["device"] == "cpu" and r["placement"] == "host,host" for r in s["ranks"])   # 2 layers, in place
    # where a rank's time goes besides its layers: opening its inputs, writing its outputs; then the export's
    assert all(0 < r["open_s"] < r["wall_s"] and 0 < r["write_s"] < r["wall_s"] for r in s["ranks"])
    assert s["scalars"]["infer/export_s"] > 0 and s["scalars"]["infer/ranks_job_s"] > max(r["wall_s"]
                                                                                          for r in s["ranks"])
    assert sage2.manifest.reproducible and sage2.manifest.upstream_builds == {}   # a CPU model, a CPU inference


@pytest.mark.slow
def test_exact_inference_of_gat_gathers_each_chunks_sources_and_equals_the_whole_graph(gat2: Case):
    check_against_reference(gat2, layers=[0])
    s = gat2.manifest.summary
    assert s["path"] == "layer-wise (per-chunk gather)" and all(r["remote_mib"] > 0 for r in s["ranks"])


@pytest.mark.slow
def test_exact_inference_on_three_partitions_equals_the_whole_graph_gcn_all_layers(gcn3: Case):
    check_against_reference(gcn3, layers=[0, 1])
    s = gcn3.manifest.summary
    assert s["num_partitions"] == 3 and s["num_layers"] == 3 and s["embedding_layers"] == [0, 1]
    assert len({r["chunks"] for r in s["ranks"]}) >= 1 and all(len(r["layer_s"]) == 3 for r in s["ranks"])


@pytest.mark.slow
def test_a_plain_plugin_model_runs_whole_on_each_chunks_neighbourhood(plugin2: Case):
    check_against_reference(plugin2, layers=[0])
    assert plugin2.manifest.summary["path"].startswith("whole model per chunk")


@pytest.mark.slow
def test_report_metrics_and_files(sage2: Case):
    man, art = sage2.manifest, sage2.artifact
    assert {"predictions.parquet", "metrics.json"} <= set(man.files)
    assert any(f.startswith("nodes.zarr/") for f in man.files) and any(f.startswith("part-1.zarr/") for f in man.files)
    rep = infer.report(man)
    assert "exact inference of 3,000 nodes on 2 rank(s)" in rep.headline and "predictions.parquet" in rep.headline
    assert [row["split"] for row in rep.table] == list(SPLITS)
    train_summary = sage2.manifests["train"].summary
    assert man.summary["sampled_accuracy"]["test"] == TrainSummary.from_json(train_summary).test_metric
    metrics = art.metrics()
    assert metrics["scalars"]["infer/acc_test"] == man.summary["accuracy"]["test"]
    assert all(isinstance(v, float) for v in metrics["scalars"].values())
    assert len(metrics["ranks"]) == 2 and all(r["peak_rss_bytes"] > 0 for r in metrics["ranks"])
    # dictionary pages for the columns of few values only (storage.infer_export.FEW_VALUED), never the floats
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(art.predictions_url, "rb") as f:
        group = pq.ParquetFile(f).metadata.row_group(0)
        paged = {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(group.num_columns)}
    assert {name for name, has in paged.items() if has} == {"pred", "label", "split"} and "prob_0" in paged


@pytest.mark.slow
def test_the_stage_is_cached_and_runtime_settings_are_not_in_its_key(sage2: Case):
    before = [b for b in sage2.store.builds() if b["stage"] == "infer"]
    again = infer.run(sage2.store, Params(threads_per_rank=2, chunk_edges=123, timeout_s=5.0),
                      {u: sage2.manifests[u] for u in infer.UPSTREAM}, log=lambda line: None)
    assert again.key == sage2.manifest.key and again.build_id == sage2.manifest.build_id
    assert [b for b in sage2.store.builds() if b["stage"] == "infer"] == before and len(before) == 1


@pytest.mark.slow
def test_sampled_inference_is_an_artifact_of_its_own(sage2: Case):
    sampled = infer.run(sage2.store, Params(fanouts=(3, 3), threads_per_rank=1, chunk_edges=2000),
                        {u: sage2.manifests[u] for u in infer.UPSTREAM}, log=lambda line: None)
    s = sampled.summary
    assert sampled.key != sage2.manifest.key and s["mode"] == "sampled" and s["fanouts"] == [3, 3]
    assert infer.report(sampled).headline.startswith("sampled (3,3) inference of 3,000 nodes")
    art = InferArtifact(sage2.store, sampled)
    for rank in art.metrics()["ranks"]:   # a layer aggregates at most 3 sampled in-neighbours of each node
        assert all(0 < layer["edges"] <= 3 * rank["nodes"] for layer in rank["layers"])
    prob = np.asarray(art.node_array("prob")[:])
    np.testing.assert_allclose(prob.sum(1), 1.0, atol=1e-5)
    assert np.abs(prob - sage2.reference.prob).max() > 1e-3   # not the exact outputs


@pytest.mark.slow
def test_a_zero_host_budget_and_exports_on_dask_rebuild_the_same_bytes(sage2: Case, dask_cluster: str):
    """``host_memory_budget_bytes=0``: the ranks read x from Zarr and map their layer matrices in the job's scratch
    directory (removed with the job); ``executor``: the export's chunks are units on a 2-worker cluster
    (``stages.infer.export_units``; many chunks over 2 units: tests/test_executor_sort.py). The rebuilt artifact
    (same key: both runtime settings, one torchrun job for the two) has the same bytes."""
    want = _outputs(sage2.store, sage2.manifest)
    rebuilt = infer.run(sage2.store, Params(host_memory_budget_bytes=0, executor=dask_cluster, threads_per_rank=1,
                                            chunk_edges=2000),
                        {u: sage2.manifests[u] for u in infer.UPSTREAM}, force=True, log=lambda line: None)
    assert rebuilt.key == sage2.manifest.key and rebuilt.build_id != sage2.manifest.build_id
    ranks = rebuilt.summary["ranks"]
    assert all(r["feature_store"] == "zarr" and r["mapped_mib"] > 0 for r in ranks)
    assert rebuilt.summary["export_executor_slots"] == 1 and len(rebuilt.summary["export_units"]) == 1   # 1 chunk
    assert _outputs(sage2.store, rebuilt) == want and "predictions.parquet" in want
    assert not infer_job_dir(sage2.store, rebuilt.key).exists()   # its scratch directory with it


def _outputs(store: ArtifactStore, manifest: Manifest) -> dict[str, bytes]:
    """An infer build's parts and exports (``metrics.json`` and the event files hold timings)."""
    return {name: data for name, data in artifact_files(store, manifest).items()
            if name.startswith(("part-", "nodes.zarr", "predictions"))}
