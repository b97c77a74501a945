"""Train stage: DDP training of a GNN on the partitioned graph, one torchrun rank per partition.

Contract: partition + features + hotness manifests + params → artifact ``train/<key>/`` with ``model.pt``,
``metrics.json``, ``curves.png`` and ``hit_rate.png`` (format in ``storage.train``). The job runs in a torchrun
subprocess (``stages.train.launcher``); checkpoints live in ``<artifacts>/.checkpoints/train-<key>/`` so that a
killed or timed-out attempt resumes on the next one, and are removed once the artifact is published.

Across machines (``cluster``, from ``gnnpipe train --nnodes/--rdzv`` or Slurm) every node runs this with the
same params: each launches its share of the ranks, keeps its checkpoints under ``node-<n>/``, and node 0
publishes the artifact.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.report import Report, markdown_table
from storage.store import stage_key
from storage.train import CURVES_PNG, HIT_RATE_PNG, METRICS, MODEL, checkpoint_dir
from stages.meter import measure
from stages.train.params import RUNTIME_FIELDS, Params
from stages.train.cluster import Cluster, rank_threads
from stages.train.spec import TrainSpec, artifact_fingerprint, check_lineage

NAME = "train"
VERSION = 1
UPSTREAM = ("partition", "features", "hotness")
__all__ = ["NAME", "VERSION", "UPSTREAM", "Params", "RUNTIME_FIELDS", "run", "report", "runtime_options"]


def _default_log() -> Callable[[str], None]:
    """Prefect's run logger inside a flow/task run (the lines show in the UI), else the ``gnnpipe.train`` logger.
    Prefect is only asked when already imported: importing it just to find no run would cost seconds."""
    if "prefect" in sys.modules:
        try:
            from prefect import get_run_logger

            return get_run_logger().info
        except Exception:  # noqa: BLE001 - MissingContextError outside a run
            pass
    return logging.getLogger("gnnpipe.train").info


def runtime_options(params: Params) -> dict[str, Any]:
    """``{"runtime": {...}}``: the RUNTIME_FIELDS of ``params``, for a caller that rebuilds Params from
    ``key_params()`` (the flow's tasks do), to hand back to ``run`` as keyword arguments (Prefect ``options``)."""
    return {"runtime": params.model_dump(mode="json", include=set(RUNTIME_FIELDS))}


def run(store: ArtifactStore, params: Params, upstream: dict[str, Manifest], *, force: bool = False,
        progress: bool = True, log: Callable[[str], None] | None = None,
        runtime: Mapping[str, Any] | None = None, cluster: Cluster | None = None) -> Manifest | None:
    """Train (or find) the model for ``params`` on these upstream artifacts. ``log`` receives every job line;
    ``runtime`` overrides RUNTIME_FIELDS of ``params`` (timeouts, memory budget, threads, device).

    With a multi-node ``cluster`` this runs this node's share of the ranks; node 0 publishes the artifact and
    returns its manifest, the other nodes return None once the job has finished.
    """
    if runtime:
        unknown = sorted(set(runtime) - set(RUNTIME_FIELDS))
        if unknown:
            raise InputError(f"not runtime settings of the train stage: {', '.join(unknown)} "
                             f"(runtime settings: {', '.join(RUNTIME_FIELDS)})")
        params = Params(**{**params.model_dump(), **runtime})
    cluster = cluster or Cluster()
    partition, features, hotness = upstream["partition"], upstream["features"], upstream["hotness"]
    check_lineage(partition, features, hotness)
    num_partitions = int(partition["summary"]["num_partitions"])
    nproc = cluster.nproc_per_node(num_partitions)   # "3 partitions on 2 nodes" fails here, before any launch
    key = stage_key(NAME, VERSION, params.key_params(), upstream)
    ckpt_dir = checkpoint_dir(store, key)
    if cluster.multi_node:
        ckpt_dir = ckpt_dir / f"node-{cluster.node_rank}"   # a shared file system must not mix nodes' files
    log = log or _default_log()

    def train_job() -> tuple[dict[str, Any], Path]:
        from stages.train.launcher import launch

        result_dir = ckpt_dir / "result"
        shutil.rmtree(result_dir, ignore_errors=True)   # only this attempt's results are read back
        result_dir.mkdir(parents=True)
        spec = TrainSpec(artifacts=store.root, key=key, partition_key=partition["key"],
                         features_key=features["key"], hotness_key=hotness["key"],
                         num_partitions=num_partitions, params=params.model_dump(mode="json"),
                         checkpoint_dir=str(ckpt_dir), result_dir=str(result_dir), node_rank=cluster.node_rank,
                         fingerprint=artifact_fingerprint(store, key, upstream))
        spec_path = ckpt_dir / "spec.json"
        spec.save(spec_path)
        launch(str(spec_path), num_partitions, result_dir=str(result_dir), log=log, timeout_s=params.timeout_s,
               env={"OMP_NUM_THREADS": str(rank_threads(params.threads_per_rank, nproc))}, cluster=cluster)
        return json.loads((result_dir / METRICS).read_text()), result_dir

    if not cluster.publishes:
        if not force and store.find(NAME, key) is not None:
            log(f"train/{key} is already built in {store.root}; nothing to do on node {cluster.node_rank}")
            return None
        train_job()
        _remove_checkpoints(ckpt_dir, cluster)
        log(f"node {cluster.node_rank}: the job finished; node 0 publishes train/{key}")
        return None

    def body(writer: StageWriter) -> None:
        from stages.train.plot import curves_png, hit_rate_png

        with measure() as cost:
            metrics, result_dir = train_job()
            writer.write_bytes(MODEL, (result_dir / MODEL).read_bytes())
            writer.write_json(METRICS, metrics)
            writer.write_bytes(CURVES_PNG, curves_png(metrics["epochs"], metrics["test_acc"]))
            writer.write_bytes(HIT_RATE_PNG, hit_rate_png(metrics["epochs"], metrics["cache_policy"]))
        writer.summary.update(_summary(metrics, num_partitions, cluster.nnodes))
        writer.summary.update(cost)

    manifest = store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)
    _remove_checkpoints(ckpt_dir, cluster)   # published: nothing left to resume
    return manifest


def _remove_checkpoints(ckpt_dir: Path, cluster: Cluster) -> None:
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    if cluster.multi_node:
        try:   # train-<key>/ itself, once the last node's directory is gone (a shared file system)
            ckpt_dir.parent.rmdir()
        except OSError:
            pass


def _summary(metrics: dict[str, Any], num_partitions: int, nnodes: int) -> dict[str, Any]:
    epochs = metrics["epochs"]
    table = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in e.items()} for e in epochs]
    n = max(len(epochs), 1)
    return {"test_acc": metrics["test_acc"], "best_val_acc": metrics["best_val_acc"],
            "best_epoch": metrics["best_epoch"], "final_val_acc": metrics["final_val_acc"],
            "num_partitions": num_partitions, "world_size": metrics["world_size"], "nodes": nnodes,
            "model": metrics["model"],
            "cache_policy": metrics["cache_policy"], "device": metrics["device"], "backend": metrics["backend"],
            "resumed_from_epoch": metrics["resumed_from_epoch"], "ranks": metrics["ranks"],
            "mean_epoch_s": sum(e["epoch_s"] for e in epochs) / n,
            "mean_hit_rate": sum(e["hit_rate"] for e in epochs) / n,
            "remote_bytes_per_epoch": sum(e["remote_bytes"] for e in epochs) / n,
            "epochs": table}


def report(manifest: Manifest) -> Report:
    s = manifest["summary"]
    m = s["model"]
    nodes = f" over {s['nodes']} nodes" if s.get("nodes", 1) > 1 else ""
    headline = (f"{m['kind']} {m['num_layers']}×{m['hidden']} on {s['world_size']} rank(s){nodes}: test accuracy "
                f"{100 * s['test_acc']:.2f} % (best val {100 * s['best_val_acc']:.2f} % at epoch "
                f"{s['best_epoch'] + 1}), {len(s['epochs'])} epochs, {s['mean_epoch_s']:.2f} s/epoch, cache "
                f"{s['cache_policy']} hit rate {100 * s['mean_hit_rate']:.1f} %, "
                f"{s['remote_bytes_per_epoch'] / 2**20:.1f} MiB remote/epoch")
    cols = ("epoch", "loss", "train_acc", "val_acc", "epoch_s", "sampled_edges_per_s", "hit_rate", "cached_rows",
            "local_rows", "remote_rows", "remote_bytes")
    table = [{**{c: e[c] for c in cols}, "epoch": e["epoch"] + 1} for e in s["epochs"]]   # 1-based, as logged
    ranks = [{k: v for k, v in r.items()} for r in s["ranks"]]
    resumed = (f"\n\nResumed from the checkpoint after epoch {s['resumed_from_epoch'] + 1}."
               if s["resumed_from_epoch"] is not None else "")
    md = (f"## train `{manifest['key']}`\n\n{headline}\n\nDevice {s['device']} ({s['backend']}); "
          f"{m['parameters']:,} parameters, {m['in_channels']} features → {m['out_channels']} classes. Accuracies "
          f"are global over ranks (OGB Evaluator acc).{resumed}\n\n### Per epoch\n\n{markdown_table(table)}\n\n"
          f"### Ranks\n\n{markdown_table(ranks)}\n")
    return Report(headline, table, md, images={"training curves": CURVES_PNG, "feature cache": HIT_RATE_PNG})
