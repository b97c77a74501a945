"""What attempts at a build leave outside its artifact, and when it may go.

An artifact exists only once complete (``storage.store``), so the work of an attempt lives beside it::

    <root>/<stage>/.tmp-<key>-<id>/         the build's work directory (``ArtifactStore.writing``)
    <root>/.jobs/infer-<key>/               the infer job's spec and rank results (``infer_job_dir``)
    <root>/.checkpoints/train-<key>/        the train job's checkpoints (``storage.train.checkpoint_dir``)
    (object-store roots: the job directories are in the local temp dir)

A run that ends, however it ends short of SIGKILL, removes its work directory and infer job directory; a killed one
cannot. Two rules decide when the next run may, both with the stage's lock held (``flows.locks``), so that no live
run is building that key:

- **unfinished work** (work directories, the infer job directory) is garbage whenever no live run builds the key:
  the next attempt at the key, which holds the lock, removes it before it starts (:func:`remove_unfinished`);
- **resumable work** (train checkpoints) is kept for the next attempt to resume from, and is garbage once the
  artifact exists: a run that finds the artifact valid removes it too (:func:`remove_all`).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from storage.inventory import TMP_PREFIX
from storage.store import ArtifactStore
from storage.train import checkpoint_dir

JOBS_DIR = ".jobs"


def infer_job_dir(store: ArtifactStore, key: str) -> Path:
    """Where the infer job of artifact ``key`` keeps its spec and the ranks' results while it runs (an object-store
    root's: in the local temp dir, apart per root, since two roots' runs do not share a lock)."""
    if store.is_local:
        return Path(store.base) / JOBS_DIR / f"infer-{key}"
    root = hashlib.sha256(store.root.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "gnnpipe-jobs" / root / f"infer-{key}"


def _work_dirs(store: ArtifactStore, stage: str, key: str) -> list[Path]:
    if not store.is_local:   # object stores write in place: nothing beside the artifact
        return []
    stage_dir = Path(store.base) / stage
    return sorted(p for p in stage_dir.glob(f"{TMP_PREFIX}{key}-*") if p.is_dir()) if stage_dir.is_dir() else []


def unfinished(store: ArtifactStore, stage: str, key: str) -> list[Path]:
    """Work of earlier attempts at ``stage/key`` that no attempt can use."""
    found = _work_dirs(store, stage, key)
    if stage == "infer" and infer_job_dir(store, key).is_dir():
        found.append(infer_job_dir(store, key))
    return found


def resumable(store: ArtifactStore, stage: str, key: str) -> list[Path]:
    """Work of earlier attempts at ``stage/key`` that the next attempt resumes from."""
    job = checkpoint_dir(store, key) if stage == "train" else None
    return [job] if job is not None and job.is_dir() else []


def _remove(paths: list[Path]) -> list[Path]:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    return paths


def remove_jobs(store: ArtifactStore, stage: str) -> list[Path]:
    """Delete every infer job directory of this root when cleaning ``stage`` (``gnnpipe clean``), and the
    ``.jobs`` directory once empty; returns those removed."""
    if stage != "infer":
        return []
    base = infer_job_dir(store, "x").parent
    removed = _remove(sorted(base.glob("infer-*"))) if base.is_dir() else []
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()
    return removed


def remove_unfinished(store: ArtifactStore, stage: str, key: str) -> list[Path]:
    """Delete :func:`unfinished` (the caller holds the stage's lock); returns what was removed."""
    return _remove(unfinished(store, stage, key))


def remove_all(store: ArtifactStore, stage: str, key: str) -> list[Path]:
    """Delete :func:`unfinished` and :func:`resumable` (the caller holds the lock and the artifact is valid)."""
    return _remove(unfinished(store, stage, key) + resumable(store, stage, key))
