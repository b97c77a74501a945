"""The tasks room and its registry: ``TASKS`` maps each ``task`` parameter value to its ``TaskDef``.

- ``base``: the ``Task`` protocol (a task on one rank's data), the ``TaskDef`` (a task name's answers to what the
  trainer, the train stage and hotness ask), ``checked_loss``.
- ``kinds``: the built-in ``TaskDef`` s, ``NODE`` and ``LINK`` (torch-free: the parameters read them).
- ``node``: ``NodeClassification``, OGB accuracy.
- ``link``: ``LinkPrediction`` and ``LinkModel`` (encoder + decoder); ``link_decoders``: a pair's score from its two
  node embeddings, and the loss; ``link_metrics``: OGB's link metrics over all ranks (the trainer's and infer's).

Adding a task: a ``Task`` module here, its ``TaskDef`` in ``TASKS`` and its name in ``stages.choices.TaskName``
(tests/test_task_registry.py checks the two agree). The ``Task`` classes are importable from here too, imported on
first use so that importing the registry imports no torch.
"""

from __future__ import annotations

from typing import Any

from stages.train.tasks.base import Task, TaskDef, checked_loss, unknown_task
from stages.train.tasks.kinds import LINK, NODE

TASKS: dict[str, TaskDef] = {t.name: t for t in (NODE, LINK)}

# names this package re-exports from its torch-importing modules, on first use (PEP 562)
_LAZY = {"NodeClassification": "node", "ogb_accuracy_counts": "node", "LinkPrediction": "link",
         "LinkModel": "link"}

__all__ = ["TASKS", "Task", "TaskDef", "checked_loss", "task_def", *_LAZY]


def task_def(name: str) -> TaskDef:
    """The ``TaskDef`` of ``task=name``; an unknown name is one InputError listing the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise unknown_task(name, list(TASKS)) from None


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"stages.train.tasks.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
