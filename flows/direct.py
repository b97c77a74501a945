"""The stages of a config run in this process, one after the other, without Prefect: what the flow's tasks do,
for tests and benchmarks that time or inspect the stages themselves."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flows.config import STAGES, make_config
from stages.executor import run_scope
from storage import ArtifactStore, Manifest


def run_stages(cfg_values: Mapping[str, Any], on_built: Callable[[str, Manifest], None] | None = None
               ) -> tuple[ArtifactStore, dict[str, Manifest]]:
    """Build (or find) every stage of the config ``cfg_values``; ``on_built(name, manifest)`` after each.
    Returns the store and each stage's manifest."""
    cfg = make_config(dict(cfg_values))
    store = ArtifactStore(cfg.artifacts)
    manifests: dict[str, Manifest] = {}
    with run_scope() as before_stage:   # one dask[:N] cluster for the stages (stages.executor)
        for name in cfg.stages():
            module, params = STAGES[name], cfg.stage_params(name)
            before_stage(params)
            manifests[name] = module.run(store, params, {u: manifests[u] for u in module.UPSTREAM}, progress=False)
            if on_built is not None:
                on_built(name, manifests[name])
    return store, manifests
