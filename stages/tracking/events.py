"""TensorBoard event files in the train and infer artifacts.

Each stage writes one event file, ``tb/events.out.tfevents.<stage>.<key>``, into the artifact being built, so that
``tensorboard --logdir <artifacts root>`` shows every build as a run named ``train/<key>/tb`` or ``infer/<key>/tb``.
The file is written by ``torch.utils.tensorboard`` (the ``tensorboard`` package) into a local temporary directory
and copied into the artifact through the ``StageWriter``: the artifact root may be an object store.

Train: per-epoch scalars (``stages.tracking.epoch_scalars``) with wall times spaced by the epochs' own durations, the
final figures, the parameters and final figures in the HParams dashboard, the parameters and artifact keys as text,
and the figures (``curves.png``, ``hit_rate.png``, ``phases.png`` where the build has it) as images. Infer: its
``scalars``, parameters and keys.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.tracking import artifact_keys, epoch_scalars, final_scalars, flat_params
from storage.tracking import event_file_name

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from storage import StageWriter

def write_train_events(writer: StageWriter, metrics: Mapping[str, Any], images: Mapping[str, bytes]) -> None:
    """The train build's event file: ``metrics`` as ``metrics.json`` holds them, ``images`` tag -> PNG bytes."""
    keys = artifact_keys(writer.stage, writer.key, {name: m.key for name, m in writer.upstream.items()})
    final = final_scalars(metrics)
    last = int(metrics["last_epoch"])

    def fill(tb: SummaryWriter) -> None:
        epochs = [int(e["epoch"]) for e in metrics["epochs"]]
        elapsed = list(accumulate(float(e.get("epoch_s") or 0) + float(e.get("eval_s") or 0)
                                  for e in metrics["epochs"]))
        start = time.time() - (elapsed[-1] if elapsed else 0.0)   # each epoch at its end, as if it ended now
        done = {epoch: start + t for epoch, t in zip(epochs, elapsed)}
        for tag, step, value in epoch_scalars(metrics):
            tb.add_scalar(tag, value, step, walltime=done[step])
        _common(tb, writer.params, keys, final, step=last)
        for tag, png in images.items():
            tb._get_file_writer().add_summary(_png_summary(tag, png), last)

    _publish(writer, fill)


def write_infer_events(writer: StageWriter, scalars: Mapping[str, float]) -> None:
    """The infer build's event file: its flat ``scalars`` at step 0, its parameters and keys."""
    keys = artifact_keys(writer.stage, writer.key, {name: m.key for name, m in writer.upstream.items()})
    _publish(writer, lambda tb: _common(tb, writer.params, keys, dict(scalars), step=0))


def _common(tb: SummaryWriter, params: Mapping[str, Any], keys: Mapping[str, str], figures: Mapping[str, float],
            *, step: int) -> None:
    """Figures as scalars and as the HParams session's metrics, the parameters and the artifact keys
    (``key.<stage>``) as its hparams, and both as markdown text too."""
    from torch.utils.tensorboard.summary import hparams

    for tag, value in figures.items():
        tb.add_scalar(tag, value, step)
    file_writer = tb._get_file_writer()
    session = {**flat_params(params), **{f"key.{stage}": key for stage, key in keys.items()}}
    for summary in hparams(session, dict(figures)):
        file_writer.add_summary(summary, step)
    tb.add_text("gnnpipe/artifacts", _table(("stage", "key"), keys.items()), step)
    tb.add_text("gnnpipe/params", _table(("parameter", "value"), flat_params(params).items()), step)


def _table(header: tuple[str, str], rows: Any) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    return "\n".join([*lines, *(f"| {a} | `{b}` |" for a, b in rows)])


def _png_summary(tag: str, png: bytes) -> Any:
    """An image summary of an encoded PNG as it is (its size from the IHDR chunk): no decoding, no re-encoding."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    width, height = struct.unpack(">II", png[16:24])
    channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(png[25], 4)   # the PNG colour type: grey, RGB, palette, +alpha
    image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=png)
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def _publish(writer: StageWriter, fill: Callable[[SummaryWriter], None]) -> None:
    """Write one event file with ``fill`` in a local temporary directory, then copy it into the artifact."""
    from torch.utils.tensorboard import SummaryWriter

    with tempfile.TemporaryDirectory(prefix="gnnpipe-tb-") as tmp:
        tb = SummaryWriter(log_dir=tmp, max_queue=1 << 20, flush_secs=1 << 20)   # flushed once, by close()
        try:
            fill(tb)
        finally:
            tb.close()
        (event_file,) = (p for p in Path(tmp).iterdir() if "tfevents" in p.name)
        data = event_file.read_bytes()
    writer.store.fs.makedirs(os.path.dirname(writer.file_url(event_file_name(writer.stage, writer.key))),
                             exist_ok=True)
    writer.write_bytes(event_file_name(writer.stage, writer.key), data)
