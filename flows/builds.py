"""What a run of a config would take from the cache, stage by stage, without running anything: ``gnnpipe
status``, the CLI's every-stage-cached shortcut and the multi-node train command ask it.

A build found under its key is still rebuilt when it rests on another build of a stage that is not reproducible
(``Manifest.made_from``): e.g. features made before a partition by KaMinPar on several threads was rebuilt. Such
a build is ``stale``, and so is what rests on it: a stale stage is assumed to rebuild as its upstream builds say,
plus a fresh build id of its own where its old build was not reproducible. A missing stage is assumed to rebuild
reproducibly (whether it will depends on settings that only its run resolves, such as KaMinPar's threads on that
host), so what rests on it may show ``cached`` and still be rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flows.config import STAGES, PipelineConfig, stage_keys
from storage import ArtifactStore, Manifest
from storage.manifest import changed_builds, merge_builds, provenance

State = Literal["cached", "stale", "missing"]
_REBUILT = "(rebuilt)"   # a build id no build has: what rests on the old one is stale


@dataclass(frozen=True)
class Found:
    """One stage of a config: its key, its build in the store (None: missing), whether a run would use it, the
    ``upstream_builds`` a build made by that run would carry, and (stale) the stages whose builds changed."""

    key: str
    manifest: Manifest | None
    state: State
    behind: dict[str, str] = field(default_factory=dict)
    changed: tuple[str, ...] = ()


def config_builds(store: ArtifactStore, cfg: PipelineConfig) -> dict[str, Found]:
    """Each stage of ``cfg``, in order: ``cached`` (a run takes it as it is), ``stale`` or ``missing``."""
    expected: dict[str, dict[str, str]] = {}   # per stage: the provenance of its build, as it is or will be
    out: dict[str, Found] = {}
    for name, key in stage_keys(cfg).items():
        behind = merge_builds(expected[u] for u in STAGES[name].UPSTREAM)
        manifest = store.find(name, key)
        if manifest is None:
            expected[name] = behind
            out[name] = Found(key, None, "missing", behind)
        elif manifest.upstream_builds == behind:
            expected[name] = provenance(manifest)
            out[name] = Found(key, manifest, "cached", behind)
        else:
            expected[name] = {**behind, **({} if manifest.reproducible else {name: _REBUILT})}
            out[name] = Found(key, manifest, "stale", behind,
                              tuple(changed_builds(manifest.upstream_builds, behind)))
    return out
