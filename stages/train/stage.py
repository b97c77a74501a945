"""Train stage: DDP training of a GNN on the partitioned graph, one torchrun rank per partition.

Contract: partition + features + hotness manifests + params → artifact ``train/<key>/`` with ``model.pt`` (the
best-validation epoch's weights), ``metrics.json``, ``curves.png``, ``hit_rate.png`` and ``phases.png`` (where the
time goes, when the ranks measured it; format in ``storage.train``). The job runs in a torchrun subprocess
(``stages.jobs.launcher``); checkpoints live in ``<artifacts>/.checkpoints/train-<key>/`` so that a killed or
timed-out attempt resumes on the next one, and are removed once the artifact is published.

Across machines (``cluster``, from ``gnnpipe train --nnodes/--rdzv`` or Slurm) every node runs with the same
params: node 0 calls ``run`` and publishes the artifact, the others call ``join``; each launches its share of the
ranks and keeps its checkpoints under ``node-<n>/``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.jobs.cluster import Cluster, rank_threads
from stages.jobs.host_memory import huge_page_env
from stages.meter import measure
from stages.params import check_graph_fanouts
from stages.run_log import stage_log
from stages.tracking import require_trackers
from stages.tracking.mlflow_runs import log_train
from stages.train.models.plugin_code import plugin_files
from stages.train.models.plugins import rank_pythonpath
from stages.train.params import Params
from stages.train.report import epoch_table, phase_summary, phases_section
from stages.train.spec import TrainSpec, artifact_fingerprint, check_lineage, checkpoints_of_other_builds
from stages.train.tasks import task_def
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.manifest import build_key, builds_behind
from storage.partition import PartitionArtifact
from storage.report import Report, markdown_table, percent
from storage.train import (
    CURVES_PNG,
    HIT_RATE_PNG,
    PHASES_PNG,
    job_dir,
    read_result,
    remove_partial_writes,
    result_dir,
    spec_path,
    write_train_artifact,
)
from storage.train_summary import TrainSummary, epoch_metric

NAME = "train"
VERSION = 6   # 2: the published model and test accuracy are the best-validation epoch's; 3: no validation split
#              publishes the last epoch's model (was the first's), and empty splits score null (was 0.0);
#              4: model.pt's embedding tables in the dataset's order of each type (were in tgid order);
#              5: a checkpoint's embedding shards in one part file per rank (a 4 checkpoint cannot resume);
#              6: metrics.json and the summary name the metrics task-neutrally (test_metric, best_val_metric, ...,
#              per epoch train_metric / val_metric, with metric_name; were test_acc & co.; same values)
UPSTREAM = ("partition", "features", "hotness")
__all__ = ["NAME", "VERSION", "UPSTREAM", "Params", "run", "join", "report"]


@dataclass
class _Job:
    """This node's share of one training job: where its checkpoints go and how to launch its ranks."""

    store: ArtifactStore
    params: Params
    upstream: Mapping[str, Manifest]
    cluster: Cluster
    log: Callable[[str], None]

    def __post_init__(self) -> None:
        partition, features, hotness = (self.upstream[name] for name in UPSTREAM)
        check_lineage(partition, features, hotness)
        partition_artifact = PartitionArtifact(self.store, partition)
        self.num_partitions = partition_artifact.num_partitions
        # edge_fanouts that name no edge type of this graph fail here, before any launch
        check_graph_fanouts(self.params.fanouts, self.params.edge_fanouts, partition_artifact.schema)
        task_def(self.params.task).check_partition(partition_artifact)   # e.g. task=link needs a graph split
        check_edge_weight(self.params.edge_weight, partition_artifact.num_edge_features)
        # "3 partitions on 2 nodes" fails here, before any launch
        self.nproc = self.cluster.nproc_per_node(self.num_partitions)
        self.key = build_key(NAME, VERSION, self.params.key_params(), self.upstream)
        self.ckpt_dir = job_dir(self.store, self.key, self.cluster.node_rank if self.cluster.multi_node else None)

    def launch(self) -> Path:
        """Run the ranks to the end; returns the directory where local rank 0 left model.pt and metrics.json."""
        from stages.jobs.errors import TRAINING
        from stages.jobs.launcher import launch

        builds = builds_behind(self.upstream)
        self._drop_checkpoints_of_other_builds(builds)
        results = result_dir(self.ckpt_dir)
        shutil.rmtree(results, ignore_errors=True)   # only this attempt's results are read back
        results.mkdir(parents=True)
        spec = TrainSpec(artifacts=self.store.root, key=self.key, partition_key=self.upstream["partition"].key,
                         features_key=self.upstream["features"].key, hotness_key=self.upstream["hotness"].key,
                         params=self.params.model_dump(mode="json"),
                         checkpoint_dir=str(self.ckpt_dir), result_dir=str(results),
                         node_rank=self.cluster.node_rank,
                         fingerprint=artifact_fingerprint(self.store, self.key, self.upstream, plugin_files(
                             [self.params.model, self.params.loss,
                              *task_def(self.params.task).plugin_refs(self.params)])), upstream_builds=builds)
        spec.save(spec_path(self.ckpt_dir))
        threads = rank_threads(self.params.threads_per_rank, self.nproc)
        # the ranks run from the checkout: they find plug-ins where this process does (stages.train.models.plugins);
        # their big tensors go on huge pages, which must be asked for before they start (stages.jobs.host_memory)
        env = {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": rank_pythonpath(), **huge_page_env()}
        try:
            launch(str(spec_path(self.ckpt_dir)), self.num_partitions, result_dir=str(results), log=self.log,
                   timeout_s=self.params.timeout_s, env=env, cluster=self.cluster, job=TRAINING)
        finally:   # a checkpoint half-written by a rank the teardown killed (the launcher sweeps the results)
            remove_partial_writes(self.ckpt_dir)
        return results

    def _drop_checkpoints_of_other_builds(self, builds: dict[str, str]) -> None:
        """Remove the checkpoints a killed attempt took on other builds of the inputs (a partition rebuilt by
        KaMinPar on several threads relabels every gid, so its rows and embeddings would not match them)."""
        if not checkpoints_of_other_builds(self.ckpt_dir, builds):
            return
        self.log(f"train/{self.key}: the checkpoints in {self.ckpt_dir} were taken on other builds of "
                 f"{', '.join(sorted(builds)) or 'the inputs'}: starting afresh")
        self.remove_checkpoints()

    def remove_checkpoints(self) -> None:
        _remove_checkpoints(self.ckpt_dir, self.cluster)


def check_edge_weight(column: int | None, num_edge_features: int) -> None:
    """``edge_weight`` must name a column of the graph's edge features (before any rank starts)."""
    if column is None or column < num_edge_features:
        return
    if not num_edge_features:
        raise InputError(f"edge_weight={column} names an edge feature column, but this graph has no edge features: "
                         f"set edge_weight=null, or download a graph with edge features")
    raise InputError(f"edge_weight={column} is out of range: the graph has {num_edge_features} edge feature columns "
                     f"(0..{num_edge_features - 1})")


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True, log: Callable[[str], None] | None = None,
        cluster: Cluster | None = None) -> Manifest:
    """Train (or find) the model for ``params`` on these upstream artifacts and publish it; ``log`` receives every
    job line. With a multi-node ``cluster`` this is the publishing node's share (node 0); the others ``join``."""
    job = _Job(store, params, upstream, cluster or Cluster(), log or stage_log(NAME))
    if not job.cluster.publishes:
        raise ValueError(f"node {job.cluster.node_rank} does not publish: it joins the job with join()")
    if force or store.find(NAME, job.key, upstream) is None:
        require_trackers()   # tensorboard, and mlflow where MLFLOW_TRACKING_URI is set: now, not after training
    built = False

    def body(writer: StageWriter) -> None:
        nonlocal built
        with measure() as cost:
            model_bytes, metrics = read_result(job.launch())
            write_build(writer, model_bytes, metrics, job.num_partitions, job.cluster.nnodes)
        writer.summary.update(cost)
        built = True

    manifest = store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)
    job.remove_checkpoints()   # published: nothing left to resume
    if built:   # from the published artifact: a failing tracking server costs a warning line, never the model
        log_train(store, manifest, job.log)
    return manifest


def join(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, cluster: Cluster,
         force: bool = False, log: Callable[[str], None] | None = None) -> None:
    """A non-publishing node's share of a multi-node job: run its ranks to the end; node 0 publishes."""
    job = _Job(store, params, upstream, cluster, log or stage_log(NAME))
    if not force and store.find(NAME, job.key, upstream) is not None:
        job.log(f"train/{job.key} is already built in {store.root}; nothing to do on node {cluster.node_rank}")
        return
    job.launch()
    job.remove_checkpoints()
    job.log(f"node {cluster.node_rank}: the job finished; node 0 publishes train/{job.key}")


def write_build(writer: StageWriter, model_bytes: bytes, metrics: dict[str, Any], num_partitions: int,
                nnodes: int) -> None:
    """The artifact's files from the job's results (the model, the metrics, their figures), its TensorBoard events
    and its summary."""
    from stages.tracking.events import write_train_events
    from stages.train.plot import curves_png, hit_rate_png, phases_png

    figures = {CURVES_PNG: curves_png(metrics), HIT_RATE_PNG: hit_rate_png(metrics["epochs"], metrics["cache_policy"])}
    phases = phases_png(metrics)   # None for metrics without phases
    write_train_artifact(writer, model_bytes, metrics, figures[CURVES_PNG], figures[HIT_RATE_PNG], phases)
    # a GPU's atomic adds sum in a varying order: a retrained model differs, and the inference made from this one
    # must be redone with it (Manifest.upstream_builds); the CPU path gives the same model again
    writer.reproducible = metrics["device"] == "cpu"
    images = {"train/figures/curves": figures[CURVES_PNG], "train/figures/hit_rate": figures[HIT_RATE_PNG]}
    if phases is not None:
        images["train/figures/phases"] = phases
    write_train_events(writer, metrics, images)
    writer.summary.update(_summary(metrics, num_partitions, nnodes))


def _remove_checkpoints(ckpt_dir: Path, cluster: Cluster) -> None:
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    if cluster.multi_node:
        try:   # train-<key>/ itself, once the last node's directory is gone (a shared file system)
            ckpt_dir.parent.rmdir()
        except OSError:
            pass


def _summary(metrics: dict[str, Any], num_partitions: int, nnodes: int) -> dict[str, Any]:
    epochs = metrics["epochs"]
    n = max(len(epochs), 1)
    return {"metric_name": metrics["metric_name"], "test_metric": metrics["test_metric"],
            "test_metric_last": metrics["test_metric_last"], "best_val_metric": metrics["best_val_metric"],
            "best_epoch": metrics["best_epoch"], "last_epoch": metrics["last_epoch"],
            "final_val_metric": metrics["final_val_metric"],
            "stopped_early": metrics["stopped_early"], "task": metrics["task"], "recipe": metrics["recipe"],
            "test_metrics": metrics.get("test_metrics", {}),
            "num_partitions": num_partitions, "world_size": metrics["world_size"], "nodes": nnodes,
            "model": metrics["model"],
            "cache_policy": metrics["cache_policy"], "device": metrics["device"], "backend": metrics["backend"],
            # runtime choices a reader of the report should see (builds before them lack the keys)
            "prefetch": metrics.get("prefetch"), "ranks_per_gpu": metrics.get("ranks_per_gpu"),
            "resumed_from_epoch": metrics["resumed_from_epoch"], "ranks": metrics["ranks"],
            "mean_epoch_s": sum(e["epoch_s"] for e in epochs) / n,
            "mean_hit_rate": sum(e["hit_rate"] for e in epochs) / n,
            "remote_bytes_per_epoch": sum(e["remote_bytes"] for e in epochs) / n,
            "epochs": epoch_table(epochs), **phase_summary(metrics)}


def _types_section(t: TrainSummary) -> str:
    """A typed graph's figures per node type, summed over ranks: its input, nodes, cache rows, embedding bytes."""
    in_channels = t.model["in_channels"]
    if isinstance(in_channels, int):
        return ""
    rows = []
    for name, width in in_channels.items():
        per_rank = [r["types"][name] for r in t.ranks]
        rows.append({"node_type": name, "input": f"{width} features" if width else
                     f"learnt embedding ({t.model['hidden']} wide, sharded)",
                     "nodes": sum(t["rows"] for t in per_rank),
                     "nodes_per_rank": " / ".join(str(t["rows"]) for t in per_rank),
                     "cache_rows": sum(t.get("cache_rows", 0) for t in per_rank),
                     "embedding_MiB": round(sum(t.get("embedding_bytes", 0) for t in per_rank) / 2**20, 2)})
    return f"\n### Node types\n\n{markdown_table(rows)}\n"


def report(manifest: Manifest) -> Report:
    t = TrainSummary.from_json(manifest.summary)
    m, r = t.model, t.recipe
    nodes = f" over {t.nodes} nodes" if t.nodes > 1 else ""
    stop = f", stopped early (patience {r['patience']})" if t.stopped_early else ""
    # an empty valid or test split has no accuracy: None in the summary, "n/a" here (never "0.00 %")
    name = t.metric_name   # the task's selected metric: accuracy, or link prediction's mrr

    def shown(value: float | None) -> str:
        return percent(value) if name == "accuracy" or value is None else f"{value:.4f}"

    if t.best_val_metric is None:
        selected = f"(no validation split: the last epoch's model, epoch {t.best_epoch + 1})"
    else:
        selected = f"at the best validation epoch {t.best_epoch + 1} (val {shown(t.best_val_metric)})"
    headline = (f"{m['kind']} {m['num_layers']}×{m['hidden']} on {t.world_size} rank(s){nodes}: test {name} "
                f"{shown(t.test_metric)} {selected}; last epoch {t.last_epoch + 1}: test "
                f"{shown(t.test_metric_last)} | {len(t.epochs)} epochs{stop}, {t.mean_epoch_s:.2f} "
                f"s/epoch, cache {t.cache_policy} hit rate {100 * t.mean_hit_rate:.1f} %, "
                f"{t.remote_bytes_per_epoch / 2**20:.1f} MiB remote/epoch")
    # the metric columns named by the metric (train_accuracy, val_mrr), read under either stored key
    cols = ("epoch", "loss", f"train_{name}", f"val_{name}", *_EPOCH_FIGURES)
    table = [{**{c: ("n/a" if v is None else v) for c, v in zip(cols, _epoch_row(e))}, "epoch": e["epoch"] + 1}
             for e in t.epochs]   # epochs 1-based, as logged
    ranks = [{k: v for k, v in rank.items() if k != "types"} for rank in t.ranks]
    resumed = (f"\n\nResumed from the checkpoint after epoch {t.resumed_from_epoch + 1}."
               if t.resumed_from_epoch is not None else "")
    published = ("The published model is the best validation epoch's" if t.best_val_metric is not None else
                 "The validation split is empty: the published model is the last epoch's")
    path = (" It does not follow the block protocol: each batch ran whole, every layer over every sampled node."
            if m["whole_batch"] else "")
    inputs = (f"{m['in_channels']} features" if isinstance(m["in_channels"], int) else
              "a typed input (per node type below)")
    sharing = f", {t.ranks_per_gpu} ranks sharing each GPU" if (t.ranks_per_gpu or 1) > 1 else ""
    prefetch = f", prefetch {t.prefetch}" if t.prefetch is not None else ""
    md = (f"## train `{manifest.key}`\n\n{headline}\n\nDevice {t.device} ({t.backend}{sharing}{prefetch}); "
          f"{m['parameters']:,} parameters, {inputs} → {_outputs(m)}.{path} "
          f"Task: {t.task['name']}, {t.task['evaluator']}, global over ranks. Recipe: loss {r['loss']}, Adam "
          f"lr {r['lr']:g}, weight decay {r['weight_decay']:g}, schedule {r['lr_schedule']}, patience "
          f"{r['patience']}. {published}; \"last epoch\" is the model after the last epoch trained.{resumed}\n\n"
          f"{_test_metrics(t)}### Per epoch\n\n{markdown_table(table)}\n\n"
          f"### Ranks\n\n{markdown_table(ranks)}\n{_types_section(t)}{phases_section(t)}")
    images = {"training curves": CURVES_PNG, "feature cache": HIT_RATE_PNG}
    if PHASES_PNG in manifest.files:   # builds before the phase split have none
        images["where the time goes"] = PHASES_PNG
    return Report(headline, table, md, images=images)


_EPOCH_FIGURES = ("lr", "epoch_s", "sampled_edges_per_s", "hit_rate", "cached_rows", "local_rows", "remote_rows",
                  "remote_bytes")


def _epoch_row(e: dict[str, Any]) -> list[Any]:
    """One epoch's figures in the report's column order (the metrics under their neutral or older keys)."""
    return [e["epoch"], e["loss"], epoch_metric(e, "train_metric"), epoch_metric(e, "val_metric"),
            *(e[c] for c in _EPOCH_FIGURES)]


def _outputs(model: dict[str, Any]) -> str:
    """What the model outputs: classes, or link prediction's embeddings and the decoder that scores pairs."""
    if "decoder" in model:
        return f"{model['out_channels']}-wide node embeddings, pairs scored by the {model['decoder']} decoder"
    return f"{model['out_channels']} classes"


def _test_metrics(t: TrainSummary) -> str:
    """Every test metric of the published model, when the task has more than one (link prediction)."""
    metrics = t.test_metrics
    if len(metrics) < 2:
        return ""
    row = {k: ("n/a" if v is None else round(v, 4)) for k, v in metrics.items()}
    return f"### Test metrics of the published model\n\n{markdown_table([row])}\n\n"
