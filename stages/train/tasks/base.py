"""The Task seam: what a learning task tells the pipeline, so that the trainer, the loops and hotness hold no task's
code.

Two halves. A ``Task`` is the task on one rank's data: it names its items per split (what a batch is made of: seed
nodes, or positive edges), turns a batch of items into the nodes to sample around and a target, the sampled batch into
outputs, scores them (the loss to minimise; additive metric sums that ranks all-reduce) and names its evaluator. A
``TaskDef`` is the task's name in the parameters (``task=node``): what callers used to branch on (the default loss,
the encoder's output width, the model around the encoder, the Params fields only it uses, the items an epoch takes,
what the artifacts must hold for it, the items hotness pre-samples) and ``build``, the factory of its ``Task``. The
registry (``stages.train.tasks``) maps names to ``TaskDef`` s; adding a task is a ``Task`` module and its ``TaskDef``.

This module imports no torch at run time: the train and hotness parameters (validated in milliseconds) ask a
``TaskDef`` which of their fields make the artifact's key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from storage.errors import InputError

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch_geometric.data import Data

    from stages.train.params import Params
    from stages.train.rank.rank_data import RankData
    from storage.features import FeaturesArtifact
    from storage.partition import PartitionArtifact

LabelOf = Callable[["Tensor"], "Tensor"]   # seed gids -> int64 labels on the training device
LossFn = Callable[["Tensor", "Tensor"], "Tensor"]   # (outputs, targets) -> the batch's mean loss, 0-d
SeedsOf = Callable[["Tensor", "torch.Generator"], "Tensor"]   # a batch of items -> the gids it samples around
HotnessItems = tuple["Tensor", "SeedsOf | None", "int | None"]   # (items, how a batch becomes seeds, items an epoch)


class Task(Protocol):
    name: str                     # in reports: "node classification"
    evaluator: str                # what ``metric`` is: "accuracy (OGB Evaluator acc)"
    metric_name: str              # the selected metric's short name: "accuracy", "mrr"
    sum_names: tuple[str, ...]    # the entries of ``metric_sums``, e.g. ("correct", "total")

    @property
    def seeds_are_items(self) -> bool:
        """Whether ``batch`` returns its items themselves as the seeds (node gids): the loader then checks each
        split's items once (in range, unique) instead of the sampler checking every batch's seeds."""
        ...

    @property
    def pads_labels(self) -> bool:
        """Whether the target is one label per seed that a static-shape batch may pad with labels -100, which the
        loss and the metric sums skip (``stages.train.rank.graphed``); a task without it is never graphed."""
        ...

    def seeds(self, split: str) -> Tensor:
        """This rank's items of ``split`` (``SPLITS``), 1-D on the training device: the loader shuffles and
        batches them (node gids; under task=link, link items: docs/design.md §4)."""
        ...

    def batch(self, item: Tensor, *, training: bool) -> tuple[Tensor, Any]:
        """``(seed gids to sample around, target)`` of a batch of items: what ``forward``, ``loss`` and
        ``metric_sums`` read. Every rank calls it for every batch, empty ones too (it may be a collective)."""
        ...

    def size(self, target: Any) -> int:
        """How many items ``target`` scores: what the batch's mean loss is a mean over."""
        ...

    def forward(self, model: torch.nn.Module, x: Tensor | dict[str, Tensor], batch: Data, target: Any) -> Any:
        """The model's outputs for the batch (``x``: the rows of ``batch.n_id``; a typed graph's per node type)."""
        ...

    def loss(self, out: Any, target: Any) -> Tensor:
        """The mean loss of the batch, 0-d; an empty batch gives 0 that still reaches every parameter (DDP)."""
        ...

    def metric_sums(self, out: Any, target: Any) -> Sequence[float | Tensor]:
        """Sums over the batch that add up across batches and ranks (``sum_names``): numbers, or 0-dim tensors
        left on the output's device, which the loop adds there and reads once a pass (``RunningSums``)."""
        ...

    def metric(self, sums: Sequence[float]) -> float:
        """The selected metric from sums added over every batch of every rank; NaN when they cover no item (an
        empty split: the report says n/a, and model selection falls back to the last epoch)."""
        ...

    def metrics(self, sums: Sequence[float]) -> dict[str, float | None]:
        """Every metric the sums give, by name (``metrics.json``'s ``test_metrics``); None for an empty split."""
        ...


def checked_loss(value: Any, name: str) -> Tensor:
    """``value`` if it is what a loss must return (a 0-d tensor); a plug-in's anything else is one InputError."""
    from torch import Tensor  # here: this module stays importable without torch (the params import it)

    if not isinstance(value, Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise InputError(f"loss {name} returned {shape}: it must return a 0-d tensor, the batch's mean loss")
    return value




class TaskDef:
    """A task name's answers to what the pipeline asks of it (the defaults are node classification's, the simplest
    task: a subclass overrides what differs). ``build`` must be overridden."""

    name: str = ""                          # the ``task`` parameter's value: "node"
    default_loss: str = "cross_entropy"     # what ``loss=auto`` resolves to
    # the train Params fields only this task reads: the other tasks' keys leave them out (a non-default task lists
    # "task" too, so that the default task's keys stay as they were before there were tasks)
    key_fields: tuple[str, ...] = ()
    hotness_key_fields: tuple[str, ...] = ()   # the same for the hotness Params
    reseeds_validation: bool = False        # whether validation draws from its own stream (link's negatives)

    def output_width(self, hidden: int, num_classes: int) -> int:
        """The encoder's output width: the classes, or (feeding a decoder) ``hidden``."""
        return num_classes

    def wrap_model(self, encoder: torch.nn.Module, params: Params) -> torch.nn.Module:
        """The module DDP trains around the encoder (the encoder itself, or the encoder and a decoder)."""
        return encoder

    def plugin_refs(self, params: Params) -> list[str]:
        """The task's own plug-in import paths among the Params (an edit of their code retrains)."""
        return []

    def epoch_items(self, params: Params) -> int | None:
        """The train items an epoch takes over all ranks (None: all of them)."""
        return None

    def batch_seeds(self, params: Params) -> int:
        """The most seeds one batch samples around (the device budget's batch estimate,
        ``stages.train.rank.cache_budget``): ``batch_size`` items of one seed each."""
        return params.batch_size

    def seed_types(self, partition: PartitionArtifact) -> tuple[str, ...]:
        """The node types a batch's seeds may have (the device budget's batch estimate): the labelled types (every
        type where none is)."""
        schema = partition.schema
        return tuple(t.name for t in schema.labelled or schema.node_types)

    def summary_model(self, params: Params) -> dict[str, Any]:
        """What the task adds to ``metrics.json``'s ``model`` record."""
        return {}

    def check_partition(self, partition: PartitionArtifact) -> None:
        """InputError if the partition artifact lacks what this task trains on (before any launch)."""

    def build(self, params: Params, data: RankData, generator: torch.Generator) -> Task:
        """The task on this rank's data; ``generator``: the stream its draws (negatives) come from."""
        raise NotImplementedError(f"task {self.name} has no build")

    def hotness_items(self, params: Any, partition: PartitionArtifact, features: FeaturesArtifact, p: int
                      ) -> HotnessItems:
        """Partition p's train items, how a batch of them becomes sample seeds (None: they are the seeds) and how
        many an epoch takes (None: all), as the trainer batches them: what hotness pre-samples. ``params``: the
        hotness Params (its fields named as the train ones)."""
        import torch

        train_gid = features.part(p, load_x=False).split_lids["train"] + int(partition.bounds()[p])
        return torch.from_numpy(train_gid), None, None


def key_without(out: dict[str, Any], name: str, tasks: Sequence[TaskDef], *, hotness: bool = False) -> None:
    """Drop from ``out`` (a Params' key) the fields that only tasks other than ``name`` read."""
    own = {f for t in tasks if t.name == name for f in (t.hotness_key_fields if hotness else t.key_fields)}
    for task in tasks:
        for field in task.hotness_key_fields if hotness else task.key_fields:
            if field not in own:
                out.pop(field, None)


def unknown_task(name: str, known: Sequence[str]) -> InputError:
    return InputError(f"task={name} is not a known task: use one of {', '.join(known)}")
