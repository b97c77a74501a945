"""Infer stage: predictions and embeddings of every node, in the dataset's own ids, from the trained model.

Contract: partition + features + train manifests + params → artifact ``infer/<key>/`` with ``part-<p>.zarr`` per
partition, ``nodes.zarr`` and ``predictions.parquet`` in orig-id order, and ``metrics.json`` (format in
``storage.infer``).

One torchrun rank per partition, launched as the train stage launches its ranks (``stages.jobs.launcher``: own
session, streamed logs, group teardown), on the CPU with gloo. Each rank computes every layer of the model for all
of its nodes in bounded chunks, fetching its remote in-neighbours' rows of the previous layer from their owners
with the feature exchange (``stages.infer.layerwise``: the algorithm and its memory bound), and writes its rows
into the artifact being built; the stage then exports them in orig-id order, a chunk of ids at a time on each of
a few threads (on the ``executor``, chunks written by units: ``stages.infer.export_units``).

Exact by default (every in-edge: what the model computes on the whole graph); ``fanouts`` samples each layer's
neighbours instead. A model without the block protocol (a plain PyG ``forward(x, edge_index)`` plug-in) is run
whole on each chunk's full L-hop neighbourhood: exact too, but its memory is bounded by that neighbourhood rather
than by the chunk (``layerwise``'s docstring). No checkpoints: an interrupted job reruns whole.

A link prediction model (train's ``task=link``, ``stages.infer.link``) runs its encoder the same way; its outputs
are every node's embedding (``storage.infer``: ``nodes.zarr/emb/out``), with no classes, predictions or accuracy;
after the export the stage computes its valid/test link metrics from those exact embeddings and the trained decoder
(``stages.infer.link_eval``: OGB's Evaluator and stored negatives for ogbl-*, seeded uniform negatives otherwise).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stages.executor import parse_executor
from stages.infer.export_units import export_on, labels_and_splits
from stages.infer.params import Params
from stages.infer.spec import InferSpec
from stages.infer.tasks import InferTask, build_task, infer_task
from stages.jobs.errors import JobError, JobKind
from stages.meter import measure
from stages.run_log import stage_log
from stages.tracking import require_trackers
from stages.tracking.mlflow_runs import log_infer
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.features import FeaturesArtifact
from storage.infer import (
    NODES,
    job_result_dir,
    job_scratch_dir,
    job_spec_path,
    ranks_path,
    write_metrics,
)
from storage.infer_export import export_link_embeddings, export_orig_order
from storage.leftovers import infer_job_dir
from storage.partition import PartitionArtifact, PartitionBook
from storage.report import Report
from storage.summaries import InferSummary
from storage.train_summary import TrainSummary

NAME = "infer"
# 2: typed graphs (every node type through the typed input; exports name node types); 3: a link model's build has
# its official link metrics (``stages.infer.link_eval``: valid/test from the exact embeddings); 4: the uniform link
# protocol ranks at most eval_edges positives a split; node outputs unchanged. Not bumped when predictions.parquet
# kept dictionary pages to its few-valued columns (292179f): the same values, other bytes, and no stage downstream
VERSION = 4
UPSTREAM = ("partition", "features", "train")
__all__ = ["NAME", "VERSION", "UPSTREAM", "Params", "run", "report"]


class InferenceError(JobError):
    """The inference job failed: a rank died or raised, or the job ran out of time."""


# how the launcher's errors name this job: inference keeps no checkpoints, so a failure's advice is a plain rerun
INFERENCE = JobKind("inference", InferenceError, checkpoints=False,
                    timeout_advice="; raise infer.timeout_s (now {timeout_s:g} s) and rerun")


def check_inputs(partition: Manifest, features: Manifest, train: Manifest, params: Params) -> int:
    """The model must have been trained on these very partition and features artifacts, its plug-in code must be
    the code it was trained with, and sampled inference needs one fanout per layer. Returns the model's depth."""
    for name, manifest in (("partition", partition), ("features", features)):
        got = train.upstream.get(name)
        if got != manifest.key:
            raise InputError(f"the train artifact {train.key} was trained on {name} {got}, not on the {name} "
                             f"{manifest.key} given to inference; run inference on the artifacts it was trained on")
    num_layers = len(train.params["fanouts"])
    if params.fanouts is not None and len(params.fanouts) != num_layers:
        raise InputError(f"infer.fanouts has {len(params.fanouts)} value(s) but the model has {num_layers} layers: "
                         f"give one fanout per layer, or null for exact inference")
    if "model_code" in train.params:
        from stages.train.models.plugin_code import source_digest

        if source_digest(train.params["model"]) != train.params["model_code"]:
            raise InputError(f"the code of model {train.params['model']} changed since train/{train.key} was "
                             f"trained: rerun the pipeline (which retrains it) before inference")
    return num_layers


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True, log: Callable[[str], None] | None = None) -> Manifest:
    """Run inference (or find its artifact) for the model of ``upstream["train"]`` over every node."""
    partition, features, trained = (upstream[name] for name in UPSTREAM)
    num_layers = check_inputs(partition, features, trained, params)
    if force or store.cached(NAME, VERSION, params.key_params(), upstream) is None:
        require_trackers()   # tensorboard, and mlflow where MLFLOW_TRACKING_URI is set: before any rank starts
    log = log or stage_log(NAME)
    built = False

    def body(writer: StageWriter) -> None:
        from stages.tracking.events import write_infer_events

        nonlocal built
        task = infer_task(trained)
        with measure() as cost:
            ranks_s = time.perf_counter()
            ranks = _launch(store, params, upstream, writer, log)
            ranks_s = time.perf_counter() - ranks_s   # the ranks' job: their start, their work, their exit
            common = _common_metrics(ranks, trained, params, num_layers)
            metrics = task.metrics(common, ranks, trained)
            parts = PartitionArtifact(store, partition)
            book = parts.book()
            metrics["node_types"] = _node_types(parts)
            export_s = time.perf_counter()
            export = _export(store, params, writer, upstream, metrics, parts, book, task=task, progress=progress)
            task.after_export(store, trained, parts, book, writer.file_url(NODES), metrics)
            export_s = time.perf_counter() - export_s
        metrics.update(export)
        metrics["job"] = {"wall_s": cost["wall_s"], "stage_peak_rss_bytes": cost["peak_rss_bytes"]}
        metrics["scalars"].update({"infer/job_wall_s": cost["wall_s"], "infer/ranks_job_s": round(ranks_s, 3),
                                   "infer/export_s": round(export_s, 3)})
        write_metrics(writer, metrics)
        write_infer_events(writer, metrics["scalars"])
        rank_rows = _summary_ranks(metrics)
        writer.summary.update(task.summary(metrics, rank_rows))
        # a GPU's atomic adds sum in a varying order (as in training): recorded, though no stage rests on infer
        writer.reproducible = all(r["device"] == "cpu" for r in rank_rows)
        writer.summary.update(cost)
        writer.summary.update({k: export[k] for k in ("export_executor_slots", "export_units") if k in export})
        built = True

    manifest = store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)
    if built:   # into the train build's MLflow run; a failing tracking server costs a warning line only
        log_infer(store, manifest, trained, log)
    return manifest


def _export(store: ArtifactStore, params: Params, writer: StageWriter, upstream: Mapping[str, Manifest],
            metrics: dict[str, Any], parts: PartitionArtifact, book: PartitionBook, *, task: InferTask,
            progress: bool) -> dict[str, Any]:
    """The exports in orig-id order (``storage.infer_export``): in this process with ``executor=local``, as before
    executors, else their chunks as units on the executor (``stages.infer.export_units``); returns figures."""
    layers = metrics["embedding_layers"]
    if parse_executor(params.executor).kind != "local":
        return export_on(params.executor, store, writer, partition=upstream["partition"],
                         features=upstream["features"] if task.classes else None,
                         num_classes=metrics.get("num_classes", 0), embedding_layers=layers)
    if not task.classes:   # no labels to join: the embeddings alone
        return export_link_embeddings(writer, book=book, embedding_layers=layers, schema=parts.schema,
                                      progress=progress)
    label_of_gid, split_of_gid = labels_and_splits(FeaturesArtifact(store, upstream["features"]), book.num_partitions)
    return export_orig_order(writer, book=book, label_of_gid=label_of_gid, split_of_gid=split_of_gid,
                             num_classes=metrics["num_classes"], schema=parts.schema, embedding_layers=layers,
                             progress=progress)


def _launch(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], writer: StageWriter,
            log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run the ranks to the end (they write their parts into ``writer``'s directory); every rank's figures."""
    from stages.jobs.cluster import rank_threads
    from stages.jobs.launcher import launch
    from stages.train.models.plugins import rank_pythonpath

    num_partitions = PartitionArtifact(store, upstream["partition"]).num_partitions
    key = writer.key
    job = infer_job_dir(store, key)   # beside the artifacts: the next attempt removes what a killed one left
    shutil.rmtree(job, ignore_errors=True)
    try:
        results = job_result_dir(job)
        results.mkdir(parents=True)
        spec = InferSpec(artifacts=store.root, key=key, partition_key=upstream["partition"].key,
                         features_key=upstream["features"].key, train_key=upstream["train"].key,
                         params=params.model_dump(mode="json"), out_url=writer.url, result_dir=str(results),
                         scratch_dir=str(job_scratch_dir(job)))
        spec_file = str(job_spec_path(job))
        spec.save(spec_file)
        env = {"OMP_NUM_THREADS": str(rank_threads(params.threads_per_rank, num_partitions)),
               "PYTHONPATH": rank_pythonpath()}
        launch(spec_file, num_partitions, result_dir=str(results), log=log, timeout_s=params.timeout_s, env=env,
               module="stages.infer.worker", job=INFERENCE)
        ranks: list[dict[str, Any]] = json.loads(Path(ranks_path(results)).read_text())
    finally:
        shutil.rmtree(job, ignore_errors=True)
    return ranks


def _node_types(partition: PartitionArtifact) -> list[dict[str, Any]]:
    """Per node type: its nodes, whether it is labelled, and its orig ids in the exports (type after type)."""
    schema = partition.schema
    offsets = schema.orig_offsets()
    return [{"node_type": t.name, "nodes": t.num_nodes, "labelled": t.num_classes > 0,
             "features": t.num_features or 0, "orig_ids": f"[{int(offsets[i]):,}, {int(offsets[i + 1]):,})"}
            for i, t in enumerate(schema.node_types)]


def _common_metrics(ranks: list[dict[str, Any]], trained: Manifest, params: Params,
                    num_layers: int) -> dict[str, Any]:
    """The figures of every infer build, a node classifier's or a link model's."""
    remote_bytes = sum(layer["remote_bytes"] for r in ranks for layer in r["layers"])
    scalars = {"infer/nodes": float(sum(r["nodes"] for r in ranks)),
               "infer/rank_wall_s_max": max(r["wall_s"] for r in ranks),
               "infer/rank_peak_rss_bytes_max": float(max(r["peak_rss_bytes"] for r in ranks)),
               "infer/remote_bytes": float(remote_bytes)}
    return {"mode": "exact" if params.fanouts is None else "sampled",
            "fanouts": None if params.fanouts is None else list(params.fanouts), "path": ranks[0]["path"],
            "num_nodes": sum(r["nodes"] for r in ranks), "num_partitions": len(ranks), "num_layers": num_layers,
            "embedding_layers": ranks[0]["embedding_layers"], "embeddings": params.embeddings,
            "train_key": trained.key, "model": _trained_model(trained),
            "ranks": ranks, "scalars": scalars}


def _trained_model(trained: Manifest) -> dict[str, Any]:
    """The trained model's record; train builds before it was recorded: its kind from the train parameters."""
    return dict(TrainSummary.from_json(trained.summary).model or {"kind": trained.params.get("model")})


def _summary_ranks(m: dict[str, Any]) -> list[dict[str, Any]]:
    # device and per-layer placement (stages.infer.layerwise): builds before GPU inference ran on the CPU
    return [{"rank": r["rank"], "device": r.get("device", "cpu"),
             "placement": ",".join(layer.get("placement", "host") for layer in r["layers"]),
             "nodes": r["nodes"], "edges": r["edges"], "chunks": r["chunks"],
             "feature_store": r["feature_store"], "wall_s": r["wall_s"],
             # builds before they were recorded: unknown
             "open_s": r.get("open_s"), "write_s": r.get("write_s"),
             "peak_rss_mib": round(r["peak_rss_bytes"] / 2**20, 1),
             "remote_mib": round(sum(layer["remote_bytes"] for layer in r["layers"]) / 2**20, 2),
             "layer_s": [layer["seconds"] for layer in r["layers"]],
             "mapped_mib": round(r["matrices"]["mapped_bytes"] / 2**20, 1)} for r in m["ranks"]]


def _ranks_table(s: InferSummary) -> list[dict[str, Any]]:
    cols = ("rank", "device", "placement", "nodes", "edges", "chunks", "feature_store", "open_s", "layer_s",
            "write_s", "remote_mib", "mapped_mib", "wall_s", "peak_rss_mib")
    return [{c: r.get(c) for c in cols} for r in s.ranks]   # the manifest's JSON sorts keys: put them in order


def report(manifest: Manifest) -> Report:
    s = InferSummary.from_json(manifest.summary)
    return build_task(s).report(manifest.uri, manifest.key, s, _ranks_table(s))
