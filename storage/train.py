"""The train artifact format, and the checkpoints that live beside (never inside) it.

Artifact ``train/<key>/``:

- ``model.pt``: ``torch.save`` of the trained model's ``state_dict`` (PyG BasicGNN keys: ``convs.<i>.…``).
- ``metrics.json``: ``{"epochs": [per-epoch dicts], "test_acc", "best_val_acc", "best_epoch", "world_size",
  "model", "cache", ...}``; accuracies are global (all ranks' correct / total, OGB Evaluator ``acc``).
- ``curves.png`` (loss and accuracy per epoch), ``hit_rate.png`` (feature-cache hit rate per epoch).

Checkpoints: ``<checkpoint dir>/ckpt-<epoch>.pt``, each written to a temporary name and ``os.replace``d into
place, so a killed writer never leaves a truncated checkpoint under a valid name. They live outside the
content-addressed artifact (``<artifacts root>/.checkpoints/train-<key>/``) because an artifact only exists once
complete, while checkpoints must survive a killed run so that its next attempt resumes.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

from storage.store import ArtifactStore

MODEL = "model.pt"
METRICS = "metrics.json"
CURVES_PNG = "curves.png"
HIT_RATE_PNG = "hit_rate.png"
KEEP_CHECKPOINTS = 2
_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


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


def save_checkpoint(directory: str | os.PathLike[str], epoch: int, state: dict[str, Any],
                    keep: int = KEEP_CHECKPOINTS) -> Path:
    """Write ``state`` as the checkpoint after ``epoch`` (0-based, completed) and drop all but the ``keep`` newest."""
    directory = Path(directory)
    path = directory / f"ckpt-{epoch:05d}.pt"
    atomic_write_bytes(path, torch_bytes(state))
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of the complete checkpoints in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory) if (m := _CKPT.match(name))]
    return sorted(found)


def load_latest_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest checkpoint that loads, or None. An unreadable one (a disk error; renames are atomic) is skipped
    in favour of the one before: losing an epoch beats failing the run."""
    import torch

    for _, path in reversed(list_checkpoints(directory)):
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - any unreadable file: fall back to the previous checkpoint
            continue
    return None
