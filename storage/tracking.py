"""Where a build keeps its TensorBoard event file (``stages.tracking.events`` writes it): one file per build,
``tb/events.out.tfevents.<stage>.<key>``, listed in the manifest like the build's other files, so
``tensorboard --logdir <root>`` shows every train and infer build side by side, each named by its key."""

from __future__ import annotations

TB_DIR = "tb"


def event_file_name(stage: str, key: str) -> str:
    """The artifact-relative path of a build's event file."""
    return f"{TB_DIR}/events.out.tfevents.{stage}.{key}"
