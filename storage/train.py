"""The train artifact format, and the checkpoints that live beside (never inside) it.

Artifact ``train/<key>/``:

- ``model.pt``: ``torch.save`` of the trained model's ``state_dict`` (PyG BasicGNN keys: ``convs.<i>.…``).
- ``metrics.json``: ``{"epochs": [per-epoch dicts], "test_acc", "best_val_acc", "best_epoch", "world_size",
  "model", "cache", ...}``; accuracies are global (all ranks' correct / total, OGB Evaluator ``acc``).
- ``curves.png`` (loss and accuracy per epoch), ``hit_rate.png`` (feature-cache hit rate per epoch).

Checkpoints (format, atomic save and resume agreement in ``stages.train.checkpoint``) live outside the
content-addressed artifact (``<artifacts root>/.checkpoints/train-<key>/``) because an artifact only exists once
complete, while checkpoints must survive a killed run so that its next attempt resumes.

Result directory: the job's local rank 0 writes ``model.pt`` and ``metrics.json`` (the artifact's formats) into
a local directory (``write_result``), from which the stage copies them into the artifact (``read_result``).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from storage.store import ArtifactStore, StageWriter

MODEL = "model.pt"
METRICS = "metrics.json"
CURVES_PNG = "curves.png"
HIT_RATE_PNG = "hit_rate.png"


def write_train_artifact(writer: StageWriter, model_bytes: bytes, metrics: dict[str, Any], curves_png: bytes,
                         hit_rate_png: bytes) -> None:
    """Write the train artifact's four files (``model_bytes``: a ``torch.save``d state_dict)."""
    writer.write_bytes(MODEL, model_bytes)
    writer.write_json(METRICS, metrics)
    writer.write_bytes(CURVES_PNG, curves_png)
    writer.write_bytes(HIT_RATE_PNG, hit_rate_png)


def write_result(result_dir: str | os.PathLike[str], model_state: dict[str, Any], metrics: dict[str, Any]) -> None:
    """The job's results, each file written atomically: the trained ``state_dict`` and the metrics."""
    out = Path(result_dir)
    atomic_write_bytes(out / MODEL, torch_bytes(model_state))
    atomic_write_bytes(out / METRICS, json.dumps(metrics, indent=2, sort_keys=True).encode())


def read_result(result_dir: str | os.PathLike[str]) -> tuple[bytes, dict[str, Any]]:
    """``(model_bytes, metrics)`` as ``write_result`` left them."""
    out = Path(result_dir)
    return (out / MODEL).read_bytes(), json.loads((out / METRICS).read_text())


def checkpoint_dir(store: ArtifactStore, key: str) -> Path:
    """Where the checkpoints of train artifact ``key`` live: beside the artifacts when they are local, else in the
    local temp dir (the launcher runs the ranks on this machine; rank 0 writes, the others get it broadcast)."""
    if store.is_local:
        return Path(store.base) / ".checkpoints" / f"train-{key}"
    return Path(tempfile.gettempdir()) / "gnnpipe-checkpoints" / f"train-{key}"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary sibling, fsync, then rename over ``path``: readers see all of it or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def torch_bytes(obj: Any) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
