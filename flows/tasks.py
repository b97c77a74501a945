"""One Prefect task per stage, and the cache policy they share.

The persisted result of a task is its stage's **manifest** (a small dict), never arrays: the data lives in the
artifact store. Cache key = task inputs (params + upstream refs, without ``force``/``options``) + the task's
source + the stage's explicit VERSION (bumped when the stage's helpers change, which TASK_SOURCE cannot see).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from types import ModuleType

from prefect import Task, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.locking.filesystem import FileSystemLockManager
from prefect.transactions import IsolationLevel

from flows.config import STAGES
from storage import ArtifactStore, Manifest


@dataclass
class StageVersion(CachePolicy):
    """Adds ``<stage>-v<VERSION>`` to the cache key."""

    stage: str = ""
    version: int = 0

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str:
        return f"{self.stage}-v{self.version}"


def prefect_dir(root: str) -> Path:
    """Where Prefect's cache records, results and locks live: beside the artifacts when they are local."""
    store = ArtifactStore(root)
    if store.is_local:
        return Path(store.base) / ".prefect"
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    return Path(os.environ.get("PREFECT_HOME", ".prefect")) / "gnnpipe-cache" / digest


def cache_policy(stage: str, version: int, root: str) -> CachePolicy:
    base = prefect_dir(root)
    policy = (INPUTS - "force" - "options") + TASK_SOURCE + StageVersion(stage=stage, version=version)
    return policy.configure(key_storage=base / "cache-keys",
                            lock_manager=FileSystemLockManager(lock_files_directory=base / "locks"),
                            isolation_level=IsolationLevel.SERIALIZABLE)


def _upstream(store: ArtifactStore, refs: dict[str, dict[str, str]]) -> dict[str, Manifest]:
    return {name: store.load(ref["stage"], ref["key"]) for name, ref in refs.items()}


def _stage_task(module: ModuleType) -> Task:
    """The Prefect task of one stage module (``stages/<name>/stage.py``)."""

    def run_stage(root: str, params: dict[str, Any], upstream: dict[str, dict[str, str]], force: bool = False,
                  options: dict[str, Any] | None = None) -> Manifest:
        store = ArtifactStore(root)
        return module.run(store, module.Params(**params), _upstream(store, upstream), force=force,
                          **(options or {}))

    run_stage.__qualname__ = run_stage.__name__ = f"{module.NAME}_stage"
    return task(run_stage, name=module.NAME, persist_result=True)


TASKS: dict[str, Task] = {name: _stage_task(module) for name, module in STAGES.items()}
