"""Where an artifact root's Prefect records live, and their names: cache records, task results, stage locks.

Beside the artifacts when the root is local (``<root>/.prefect/``), so that removing a root removes its records;
for an object-store root, under ``$PREFECT_HOME/gnnpipe-cache/<digest of the root>/``. Prefect-free, so that the
CLI's fast paths (a fully cached run, ``gnnpipe clean``) do not import Prefect (1-3 s on a 2-core box).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from storage import ArtifactStore

# the format of a stage task's persisted result: records of another format (a Manifest before StageOutcome) are
# not found, and the task then takes its artifact from the store instead of failing to read them
RESULT_FORMAT = "outcome1"


def prefect_dir(root: str) -> Path:
    """Where Prefect's cache records, results and locks of artifact root ``root`` live."""
    store = ArtifactStore(root)
    if store.is_local:
        return Path(store.base) / ".prefect"
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    return Path(os.environ.get("PREFECT_HOME", ".prefect")) / "gnnpipe-cache" / digest


def locks_dir(root: str) -> Path:
    """The stage locks of an artifact root (``flows.locks``)."""
    return prefect_dir(root) / "locks"


def task_key(stage: str, key: str) -> str:
    """The name of artifact ``stage/key``'s cache record and stage lock: ``<stage>-<key>-<result format>``."""
    return f"{stage}-{key}-{RESULT_FORMAT}"


def remove_failure_records(root: str) -> int:
    """Delete the records Prefect writes of a failed stage task's exception (a pickled error under a random key
    beside the stages' ``task_key`` records): they are never read, and ``gnnpipe clean --stage`` would not find
    them. Returns how many went."""
    keys = prefect_dir(root) / "cache-keys"
    if not keys.is_dir():
        return 0
    removed = 0
    for meta in keys.iterdir():
        if meta.name.endswith(f"-{RESULT_FORMAT}"):
            continue
        try:
            storage_key = json.loads(meta.read_text()).get("storage_key")
        except (OSError, ValueError, AttributeError):
            continue
        if storage_key:
            Path(storage_key).unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
        removed += 1
    return removed
