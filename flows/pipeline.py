"""The gnnpipe flow: download → partition → features → hotness → train → infer, each a cached task (up to ``until``).

Before trusting Prefect's cache for a stage, the flow checks that the stage's artifact exists and is valid; if
not, it refreshes that task's cache so the stage runs again. Reports are published as Prefect artifacts here, in
the flow, because a cached task does not run its body. Around the stages: one ``dask[:N]`` cluster for the run,
released before training (``stages.executor.run_scope``); the run recorded for the next one to mark Crashed if its
process dies (``flows.crashed``); its origin written into the manifests it builds; an earlier attempt's leftovers
tidied once a stage's artifact is valid (``flows.locks.tidy``); a user error noted so that it is said in one line
(``flows.quiet``).

The flow's parameters are not written here: ``pipeline``'s signature (names, types, defaults, and the docstring's
``Args:`` that the Prefect UI shows) is generated from the stages' Params by ``flows.config.flow_names``, so a new
stage parameter is a deployment parameter without an edit here.
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Callable
from typing import Any, cast

from flows.env import configure_prefect_env

configure_prefect_env()

from prefect import flow, get_run_logger  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.runtime import deployment, flow_run  # noqa: E402
from prefect.states import State  # noqa: E402

from flows import crashed  # noqa: E402
from flows.config import STAGES, PipelineConfig, artifact_key, flow_signature_defaults, make_config  # noqa: E402
from flows.locks import tidy  # noqa: E402
from flows.quiet import note_user_error  # noqa: E402
from flows.records import prefect_dir, remove_failure_records  # noqa: E402
from flows.tasks import TASKS, StageOutcome, cache_policy  # noqa: E402
from stages.executor import run_scope  # noqa: E402
from storage import ArtifactStore, GnnpipeError, Manifest  # noqa: E402
from storage.inventory import building_for, mark_used, own_origin  # noqa: E402


def _publish(store: ArtifactStore, name: str, manifest: Manifest) -> str:
    report = STAGES[name].report(manifest)
    markdown = report.markdown
    for title, rel in report.images.items():
        # Inline the PNG: the Prefect UI cannot reach files in the artifact store.
        png = store.read_bytes(name, manifest.key, rel)
        markdown += f"\n### {title}\n\n![{title}](data:image/png;base64,{base64.b64encode(png).decode()})\n"
    create_table_artifact(key=f"gnnpipe-{name}", table=report.table, description=report.headline)
    create_markdown_artifact(key=f"gnnpipe-{name}-report", markdown=markdown, description=report.headline)
    return report.headline


def stage_label(state_name: str | None, outcome: StageOutcome) -> str:
    """``Cached`` for a stage that computed nothing (a cache hit, or a task that found its artifact in the store),
    otherwise Prefect's name for the final state (``Completed``)."""
    return "Cached" if state_name == "Cached" or not outcome.built else state_name or "Completed"


def run_pipeline(cfg: PipelineConfig) -> dict[str, Any]:
    """Run the stages of ``cfg`` inside the current flow run; returns each stage's state, key and headline."""
    store = ArtifactStore(cfg.artifacts)
    store.check_writable()
    with run_scope() as before_stage:   # one dask[:N] cluster for the run's stages (stages.executor)
        return _run_stages(cfg, store, before_stage)


def _run_stages(cfg: PipelineConfig, store: ArtifactStore, before_stage: Callable[[Any], None]) -> dict[str, Any]:
    logger = get_run_logger()
    results: dict[str, Any] = {}
    manifests: dict[str, Manifest] = {}
    for name in cfg.stages():
        module, params = STAGES[name], cfg.stage_params(name)
        before_stage(params)   # stops the run's cluster before training: its ranks get the workers' CPUs and memory
        upstream = {u: manifests[u].key for u in module.UPSTREAM}
        key = artifact_key(module, params, upstream)
        forced = name in cfg.force
        # a build made from another build of a non-reproducible upstream is not valid: Prefect's record of it,
        # under the same key, must not be taken either (refresh_cache)
        valid = store.find(name, key, {u: manifests[u] for u in module.UPSTREAM}) is not None
        logger.info("%s: inputs %s → key %s (%s)", name, upstream or "-", key,
                    "forced" if forced else "artifact present" if valid else "to build")
        task = TASKS[name].with_options(
            cache_policy=cache_policy(name, cfg.artifacts, wait=cfg.wait),
            result_storage=prefect_dir(cfg.artifacts) / "results",
            refresh_cache=forced or not valid,
        )
        # return_state=True returns the State (Prefect's overloads type the result instead)
        state = cast("State[StageOutcome]", task(root=store.root, params=params.model_dump(mode="json"),
                                                 upstream=upstream, force=forced, return_state=True))
        if not state.is_completed():   # its exception's record is never read: leave nothing of a failure behind
            remove_failure_records(cfg.artifacts)
        outcome: StageOutcome = state.result()
        # the store's manifest, not the cache record's copy: a build rebuilt outside this flow (`gnnpipe stage`
        # runs one in a flow of its own, but a deleted .prefect/ keeps records apart) has another build id
        manifest = store.load(name, outcome.manifest.key)
        manifests[name] = manifest
        mark_used(store, name, manifest.key)   # `gnnpipe status`'s "last used"
        label = stage_label(state.name, outcome)
        for path in tidy(store.root, name, manifest.key):
            logger.info("%s: removed %s, left by an earlier attempt at this build", name, path)
        headline = _publish(store, name, manifest)
        logger.info("%s [%s] %s: %s", name, label, manifest.key, headline)
        results[name] = {"state": label, "key": manifest.key, "uri": store.url(name, manifest.key),
                         "headline": headline, "build_id": manifest.build_id}
    return results


def _pipeline(**parameters: Any) -> dict[str, Any]:
    # the flow's body: its signature and docstring are set below from the stages' Params (``_signature``)
    try:
        with crashed.tracked_run(), building_for(_origin()):
            return run_pipeline(make_config(parameters))
    except GnnpipeError as err:   # raised in the flow itself (a bad deployment parameter, a corrupted manifest)
        note_user_error(err)
        raise


def _origin() -> str:
    """Who runs this flow, recorded in the manifests it builds: the command line of the CLI that runs it in this
    process, else the flow run (and its deployment). Not an inherited ``ORIGIN_ENV``: a deployment's flow runs in
    a child of the worker, whose environment holds ``gnnpipe worker up`` (``storage.inventory.claim_origin``)."""
    if origin := own_origin():
        return origin
    run = f"flow run {flow_run.name}"
    return f"deployment {flow_run.flow_name}/{deployment.name}, {run}" if deployment.name else run


def _signature() -> tuple[inspect.Signature, str]:
    params, args = [], []
    for name, (annotation, default, description) in flow_signature_defaults().items():
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotation))
        args.append(f"    {name}: {description}")
    doc = ("Distributed-GNN pipeline on partitioned graphs (download → partition → features → hotness → train → "
           "infer).\n\n"
           "Args:\n" + "\n".join(args))
    return inspect.Signature(params, return_annotation=dict[str, Any]), doc


_pipeline.__signature__, _pipeline.__doc__ = _signature()   # type: ignore[attr-defined]
_pipeline.__annotations__ = {p.name: p.annotation for p in _pipeline.__signature__.parameters.values()}  # type: ignore[attr-defined]
pipeline = flow(name="gnnpipe", log_prints=True)(_pipeline)
