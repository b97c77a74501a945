"""One Prefect task per stage, and the cache policy they share: Prefect's cache key *is* the artifact's key.

``StageKey`` computes the key with ``flows.config.artifact_key``, as ``gnnpipe status`` does: the store's
``stage_key`` over the stage's ``key_params()`` and its upstream keys, which ``ArtifactStore.build`` computes when
the stage runs, so "Cached" means exactly "the store has this key". A task receives the stage's full Params
(runtime fields included) and its upstream keys; runtime fields are not in ``key_params()``, so raising a timeout
does not re-key. A change to a stage's code is caught by its VERSION, not by hashing source (docs/design.md §3,
tests/test_stage_versions.py).

The persisted result of a task is its stage's manifest (small), never arrays: the data lives in the artifact store.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.cache_policies import CachePolicy
from prefect.locking.filesystem import FileSystemLockManager
from prefect.transactions import IsolationLevel

from flows.config import STAGES, artifact_key
from stages.protocol import Stage
from storage import ArtifactStore, Manifest


@dataclass
class StageKey(CachePolicy):
    """``<stage>-<artifact key>``: the store's content address of what the task would build."""

    stage: str = ""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str:
        module = STAGES[self.stage]
        return f"{self.stage}-{artifact_key(module, module.Params(**inputs['params']), inputs['upstream'])}"


def prefect_dir(root: str) -> Path:
    """Where Prefect's cache records, results and locks live: beside the artifacts when they are local."""
    store = ArtifactStore(root)
    if store.is_local:
        return Path(store.base) / ".prefect"
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    return Path(os.environ.get("PREFECT_HOME", ".prefect")) / "gnnpipe-cache" / digest


def cache_policy(stage: str, root: str) -> CachePolicy:
    base = prefect_dir(root)
    return StageKey(stage=stage).configure(key_storage=base / "cache-keys",
                                           lock_manager=FileSystemLockManager(lock_files_directory=base / "locks"),
                                           isolation_level=IsolationLevel.SERIALIZABLE)


def _stage_task(module: Stage) -> Task[..., Manifest]:
    """The Prefect task of one stage module (``stages/<name>/stage.py``)."""

    def run_stage(root: str, params: dict[str, Any], upstream: Mapping[str, str], force: bool = False) -> Manifest:
        store = ArtifactStore(root)
        manifests = {name: store.load(name, key) for name, key in upstream.items()}
        return module.run(store, module.Params(**params), manifests, force=force)

    run_stage.__qualname__ = run_stage.__name__ = f"{module.NAME}_stage"
    return task(name=module.NAME, persist_result=True)(run_stage)


TASKS: dict[str, Task[..., Manifest]] = {name: _stage_task(module) for name, module in STAGES.items()}
