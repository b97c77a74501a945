"""Inference of a node classifier (train's ``task=node``, the default): every node's predicted class and class
probabilities, and the accuracy of each split. The metrics, summary and report of such a build (the link model's
are in ``stages.infer.link``); ``stages.infer.tasks`` names both.

Torch-free at import: the stage reads the manifests and writes the metrics, report and summary from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from storage import Manifest
from storage.graph import SPLITS
from storage.infer import METRICS, NODES, PREDICTIONS
from storage.report import Report, markdown_table, percent
from storage.summaries import InferSummary
from storage.train_summary import TrainSummary, epoch_metric


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def sampled_accuracy(train_summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The train stage's accuracies of the published (best-validation) model, each measured on sampled
    neighbourhoods: train as logged during its epoch (dropout on), valid and test in eval mode."""
    trained = TrainSummary.from_json(train_summary)
    return {"train": epoch_metric(trained.best_epoch_record(), "train_metric"), "valid": trained.best_val_metric,
            "test": trained.test_metric}


def node_metrics(common: dict[str, Any], ranks: list[dict[str, Any]], trained: Manifest) -> dict[str, Any]:
    """A node classifier's metrics: ``common`` and its classes, accuracies and counts."""
    correct = {s: sum(r["correct"][s] for r in ranks) for s in SPLITS}
    total = {s: sum(r["total"][s] for r in ranks) for s in SPLITS}
    accuracy = {s: _ratio(correct[s], total[s]) for s in SPLITS}
    pred_count = np.sum([r["pred_count"] for r in ranks], axis=0).astype(int).tolist()
    label_count = np.sum([r["label_count"] for r in ranks], axis=0).astype(int).tolist()
    scalars: dict[str, float] = {f"infer/acc_{s}": a for s, a in accuracy.items() if a is not None}
    scalars.update(common["scalars"])   # the accuracies first, as before
    return {**common, "num_classes": int(ranks[0]["num_classes"]), "accuracy": accuracy, "correct": correct,
            "total": total, "sampled_accuracy": sampled_accuracy(trained.summary), "pred_count": pred_count,
            "label_count": label_count, "scalars": scalars}


def node_summary(m: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's summary of a node classifier's build (``ranks``: the per-rank lines the stage lists)."""
    keys = ("mode", "fanouts", "path", "num_nodes", "num_partitions", "num_classes", "num_layers",
            "embedding_layers", "embeddings", "accuracy", "sampled_accuracy", "correct", "total", "train_key",
            "pred_count", "label_count", "scalars", "exported_nodes", "node_types")
    return {**{k: m[k] for k in keys}, "ranks": ranks, "files": {"predictions": PREDICTIONS, "nodes": NODES,
                                                                 "metrics": METRICS}}


def node_report(uri: str, key: str, s: InferSummary, ranks_table: list[dict[str, Any]]) -> Report:
    """A node classifier's build: accuracies, predicted classes, node types, ranks."""
    acc, sampled = s.accuracy, s.sampled_accuracy
    how = "exact" if s.mode == "exact" else f"sampled ({','.join(map(str, s.fanouts or []))})"
    peak = max(r["peak_rss_mib"] for r in s.ranks)
    headline = (f"{how} inference of {s.num_nodes:,} nodes on {s.num_partitions} rank(s): accuracy train "
                f"{percent(acc['train'])}, valid {percent(acc['valid'])}, test {percent(acc['test'])} (training's "
                f"sampled test {percent(sampled['test'])}) | {s.wall_s:.1f} s, peak RSS {peak:.0f} MiB/rank | "
                f"predictions: {uri}/{PREDICTIONS}")
    table = [{"split": split, "nodes": s.total[split], "exact": percent(acc[split]),
              "sampled (train stage)": percent(sampled[split])} for split in SPLITS]
    labelled = max(sum(s.label_count), 1)
    classes = [{"class": c, "predicted": n, "predicted_share": percent(n / max(sum(s.pred_count), 1)),
                "labelled": s.label_count[c], "labelled_share": percent(s.label_count[c] / labelled)}
               for c, n in enumerate(s.pred_count)]
    emb = (f"hidden layer(s) {', '.join(map(str, s.embedding_layers))} in `{NODES}/emb/layer-<l>`"
           if s.embedding_layers else "no hidden layer observed (a 1-layer model, or a plain model without "
                                         "`convs`)")
    types = [{c: t[c] for c in ("node_type", "nodes", "features", "labelled", "orig_ids")}
             for t in s.node_types or []]
    typed = (f"### Node types\n\nEvery node is predicted; the classes are those of the labelled type(s), the "
             f"hidden layers' rows are every type's embeddings. Exports name each node's `node_type` and "
             f"`type_orig_id`.\n\n{markdown_table(types)}\n\n" if len(types) > 1 else "")
    md = (f"## infer `{key}`\n\n{headline}\n\nModel of train `{s.train_key}`, {s.num_layers} layers, "
          f"computed {s.path}. Outputs in orig-id order: `{uri}/{PREDICTIONS}` (orig_id, "
          f"{'node_type, type_orig_id, ' if len(types) > 1 else ''}pred, prob_<c>, label, split) and "
          f"`{uri}/{NODES}` (pred, prob, label, split, embeddings); "
          f"embeddings: {emb}. Per partition: `part-<p>.zarr`.\n\n"
          f"### Accuracy\n\nThe train stage measured its accuracies on sampled neighbourhoods (train: during its "
          f"epoch, with dropout).\n\n{markdown_table(table)}\n\n"
          f"### Predicted classes (labelled node types)\n\n{markdown_table(classes)}\n\n{typed}"
          f"### Ranks\n\n{markdown_table(ranks_table)}\n")
    return Report(headline, table, md)
