"""Infer's task seam: what inference does differently per training task, behind one ``InferTask`` protocol, and the
task of a build looked up by name (``infer_task``). The stage, the ranks and ``score`` ask the task; none of them
compares task names. Adding a task on the infer side is one implementation here (its metrics, summary and report in
a module beside ``node`` and ``link``).

- ``node`` (a node classifier, the default): the ranks write pred and prob (``stages.infer.rank_outputs``), the
  export adds labels and splits and ``predictions.parquet``, the metrics are accuracies (``stages.infer.node``).
- ``link`` (a link prediction model): the ranks write the encoder's outputs, the node embeddings; after the export
  the stage measures its valid/test link metrics; pairs can be scored (``stages.infer.link``, ``score``).

The width of the model's last layer (the classes, or ``hidden`` under task=link) is decided where the model is
built, by the train side's ``stages.train.models.encoder.build_encoder``, which infer calls as the trainer does.

Torch-free at import (the stage imports it): what needs torch is imported where a rank asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from stages.infer.link import ENCODER, link_metrics, link_report, link_summary, submodule_state
from stages.infer.node import node_metrics, node_report, node_summary
from stages.train.tasks import task_def
from storage import InputError, Manifest
from storage.report import Report
from storage.summaries import InferSummary

if TYPE_CHECKING:
    import torch

    from stages.infer.rank_outputs import RankPart
    from storage import ArtifactStore
    from storage.partition import PartitionArtifact, PartitionBook

DEFAULT = "node"   # a manifest without a task: train records ``task`` for task=link only; builds before it are node


class InferTask(Protocol):
    """What inference does per task (the ranks, the stage's metrics/summary/report, the export, scoring)."""

    name: str
    classes: bool        # outputs are classes (pred, prob, label, split; predictions.parquet), needing the labels
    scores_pairs: bool   # ``gnnpipe score`` can score pairs from its outputs (a decoder and node embeddings)

    def model_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The weights of the node model infer runs, from the train artifact's ``model.pt`` state."""
        ...

    def write_rank(self, at: RankPart, out: torch.Tensor) -> dict[str, Any]:
        """A rank's outputs ``out`` (the last layer's rows by lid) written into its part; its task figures."""
        ...

    def metrics(self, common: dict[str, Any], ranks: list[dict[str, Any]], trained: Manifest) -> dict[str, Any]:
        """The stage's metrics: ``common`` (every build's figures) and the task's, from the ranks' figures."""
        ...

    def after_export(self, store: ArtifactStore, trained: Manifest, parts: PartitionArtifact, book: PartitionBook,
                     nodes_url: str, metrics: dict[str, Any]) -> None:
        """What the task measures from the exported outputs, added to ``metrics`` (nothing for some tasks)."""
        ...

    def summary(self, metrics: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
        """The manifest's summary (``ranks``: the per-rank lines the stage lists)."""
        ...

    def report(self, uri: str, key: str, summary: InferSummary, ranks_table: list[dict[str, Any]]) -> Report:
        """``gnnpipe show``'s report of a build."""
        ...


class NodeTask:
    """A node classifier: classes per node, accuracies per split."""

    name = "node"
    classes = True
    scores_pairs = False

    def model_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return dict(state)   # model.pt is the node model's state itself

    def write_rank(self, at: RankPart, out: torch.Tensor) -> dict[str, Any]:
        from stages.infer.rank_outputs import write_classes  # torch: in the ranks only

        return write_classes(at, out)

    def metrics(self, common: dict[str, Any], ranks: list[dict[str, Any]], trained: Manifest) -> dict[str, Any]:
        return node_metrics(common, ranks, trained)

    def after_export(self, store: ArtifactStore, trained: Manifest, parts: PartitionArtifact, book: PartitionBook,
                     nodes_url: str, metrics: dict[str, Any]) -> None:
        return None   # the accuracies come from the ranks' counts

    def summary(self, metrics: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
        return node_summary(metrics, ranks)

    def report(self, uri: str, key: str, summary: InferSummary, ranks_table: list[dict[str, Any]]) -> Report:
        return node_report(uri, key, summary, ranks_table)


class LinkTask:
    """A link prediction model: its encoder's node embeddings; pairs scored by its decoder."""

    name = "link"
    classes = False
    scores_pairs = True

    def model_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return submodule_state(state, ENCODER)   # a LinkModel's state: infer runs its encoder

    def write_rank(self, at: RankPart, out: torch.Tensor) -> dict[str, Any]:
        from stages.infer.rank_outputs import write_embeddings  # torch: in the ranks only

        return write_embeddings(at, out)

    def metrics(self, common: dict[str, Any], ranks: list[dict[str, Any]], trained: Manifest) -> dict[str, Any]:
        return link_metrics(common, ranks, trained)

    def after_export(self, store: ArtifactStore, trained: Manifest, parts: PartitionArtifact, book: PartitionBook,
                     nodes_url: str, metrics: dict[str, Any]) -> None:
        from stages.infer.link_eval import evaluate, scalars  # torch and ogb: imported for a link build only

        metrics["link_metrics"] = evaluate(store, trained, parts, book, nodes_url)
        metrics["scalars"].update(scalars(metrics["link_metrics"]))

    def summary(self, metrics: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
        return link_summary(metrics, ranks)

    def report(self, uri: str, key: str, summary: InferSummary, ranks_table: list[dict[str, Any]]) -> Report:
        return link_report(uri, key, summary, ranks_table)


# Keyed by the train parameter ``task``, whose registry (``stages.train.tasks.TASKS``) is the list of tasks:
# tests/test_infer_task.py checks that every registered task has its inference here.
INFER_TASKS: dict[str, InferTask] = {"node": NodeTask(), "link": LinkTask()}


def infer_task_named(name: str) -> InferTask:
    """The infer side of task ``name``: the train registry (``stages.train.tasks.TASKS``) says whether the task
    exists, then this one whether it has an inference; one InputError line for either."""
    task_def(name)
    try:
        return INFER_TASKS[name]
    except KeyError:
        raise InputError(f"task {name!r} has no inference (known: {', '.join(INFER_TASKS)}); "
                         f"run infer on a model trained with one of those tasks") from None


def infer_task(train: Manifest) -> InferTask:
    """The task of the train artifact ``train`` (its ``task`` parameter, recorded for task=link only)."""
    return infer_task_named(str(train.params.get("task", DEFAULT)))


def build_task(summary: InferSummary) -> InferTask:
    """The task of an infer build, from its manifest's summary (a link build records ``task``; a node one none)."""
    return infer_task_named(summary.task or DEFAULT)
