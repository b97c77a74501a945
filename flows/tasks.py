"""One Prefect task per stage, and the cache policy they share: Prefect's cache key *is* the artifact's key.

``StageKey`` computes the key with ``flows.config.artifact_key``, as ``gnnpipe status`` does: the store's
``stage_key`` over the stage's ``key_params()`` and its upstream keys, which ``ArtifactStore.build`` computes when
the stage runs, so "Cached" means "the store has this key" (and the flow refreshes a record whose build was made
from other builds of a stage that is not reproducible: ``flows.pipeline``, docs/design.md §3). A task receives the
stage's full Params (runtime fields included) and its upstream keys; runtime fields are not in ``key_params()``, so
raising a timeout does not re-key. A change to a stage's code is caught by its VERSION, not by hashing source
(docs/design.md §3, tests/test_stage_versions.py).

The persisted result of a task is a :class:`StageOutcome`, its stage's manifest (small, never arrays: the data lives
in the artifact store) and whether this task computed it. A task can run and compute nothing: its cache record was
deleted with ``.prefect/`` while the artifact stayed, or a concurrent run built it while this one waited on the
stage's lock; the flow then labels it ``Cached`` like a cache hit (Prefect's own state says ``Completed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.transactions import IsolationLevel
from pydantic import BaseModel

from flows.config import STAGES, artifact_key
from flows.locks import StageLockManager
from flows.quiet import note_user_error
from flows.records import locks_dir, prefect_dir, task_key
from stages.protocol import Stage
from storage import ArtifactStore, GnnpipeError, Manifest, leftovers


@dataclass
class StageKey(CachePolicy):
    """``<stage>-<artifact key>-<result format>``: the store's content address of what the task would build."""

    stage: str = ""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str:
        module = STAGES[self.stage]
        return task_key(self.stage, artifact_key(module, module.Params(**inputs["params"]), inputs["upstream"]))


def cache_policy(stage: str, root: str, *, wait: bool = True) -> CachePolicy:
    """The stage's key, its cache records, and its lock (``flows.locks``: one run builds a key at a time; a lock
    whose holder died is taken over). ``wait``: queue behind a live holder, or fail at once."""
    return StageKey(stage=stage).configure(key_storage=prefect_dir(root) / "cache-keys",
                                           lock_manager=StageLockManager(locks_dir(root), wait=wait),
                                           isolation_level=IsolationLevel.SERIALIZABLE)


class StageOutcome(BaseModel):
    """What a stage task returns: the artifact's manifest, and whether this task run computed it."""

    manifest: Manifest
    built: bool


def _stage_task(module: Stage) -> Task[..., StageOutcome]:
    """The Prefect task of one stage module (``stages/<name>/stage.py``)."""

    def run_stage(root: str, params: dict[str, Any], upstream: Mapping[str, str],
                  force: bool = False) -> StageOutcome:
        store = ArtifactStore(root)
        manifests = {name: store.load(name, key) for name, key in upstream.items()}
        typed = module.Params(**params)
        key = artifact_key(module, typed, upstream)
        # under the stage's lock (cache_policy), so no live run is building this key: what a killed attempt left
        # can go, and what a concurrent run finished meanwhile counts
        for path in leftovers.remove_unfinished(store, module.NAME, key):
            get_run_logger().info("%s: removed %s, left by an attempt that was killed", module.NAME, path)
        before = None if force else store.find(module.NAME, key)
        try:
            manifest = module.run(store, typed, manifests, force=force)
        except GnnpipeError as err:
            note_user_error(err)   # the CLI prints it once (flows/quiet.py)
            raise
        return StageOutcome(manifest=manifest, built=before is None or before.build_id != manifest.build_id)

    run_stage.__qualname__ = run_stage.__name__ = f"{module.NAME}_stage"
    return task(name=module.NAME, persist_result=True)(run_stage)


TASKS: dict[str, Task[..., StageOutcome]] = {name: _stage_task(module) for name, module in STAGES.items()}
