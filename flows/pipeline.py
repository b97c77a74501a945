"""The gnnpipe flow: download → partition → features (→ hotness → train → report), each a cached task.

Before trusting Prefect's cache for a stage, the flow checks that the stage's artifact exists and is valid; if
not, it refreshes that task's cache so the stage runs again. Reports are published as Prefect artifacts here, in
the flow, because a cached task does not run its body.
"""

from __future__ import annotations

import base64
from typing import Any

from flows.env import configure_prefect_env

configure_prefect_env()

from prefect import flow, get_run_logger  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402

from flows.config import DEFAULTS, STAGES, PipelineConfig, make_config  # noqa: E402
from flows.tasks import TASKS, cache_policy, prefect_dir  # noqa: E402
from storage import ArtifactStore, Manifest  # noqa: E402
from storage.store import stage_key  # noqa: E402


def _ref(manifest: Manifest) -> dict[str, str]:
    """What a downstream task receives: the upstream's identity, not its (timestamped) manifest."""
    return {"stage": manifest["stage"], "key": manifest["key"]}


def _publish(store: ArtifactStore, name: str, manifest: Manifest) -> str:
    report = STAGES[name].report(manifest)
    markdown = report.markdown
    for title, rel in report.images.items():
        # Inline the PNG: the Prefect UI cannot reach files in the artifact store.
        png = store.read_bytes(name, manifest["key"], rel)
        markdown += f"\n### {title}\n\n![{title}](data:image/png;base64,{base64.b64encode(png).decode()})\n"
    create_table_artifact(key=f"gnnpipe-{name}", table=report.table, description=report.headline)
    create_markdown_artifact(key=f"gnnpipe-{name}-report", markdown=markdown, description=report.headline)
    return report.headline


def stage_options(cfg: PipelineConfig, name: str) -> dict[str, Any]:
    """Keyword arguments for a stage's ``run`` that do not change what it computes (so not in any key)."""
    if name == "download":
        return {"download_dir": cfg.download_dir}
    if name == "train":
        return STAGES["train"].runtime_options(cfg.stage_params("train"))
    return {}


def run_pipeline(cfg: PipelineConfig) -> dict[str, Any]:
    """Run the stages of ``cfg`` inside the current flow run; returns each stage's state, key and headline."""
    logger = get_run_logger()
    store = ArtifactStore(cfg.artifacts)
    store.check_writable()
    results: dict[str, Any] = {}
    refs: dict[str, dict[str, str]] = {}
    for name in cfg.stages():
        module = STAGES[name]
        key_params = cfg.stage_params(name).key_params()  # type: ignore[attr-defined]
        upstream = {u: refs[u] for u in module.UPSTREAM}
        key = stage_key(name, module.VERSION, key_params, upstream)
        forced = name in cfg.force
        valid = store.find(name, key) is not None
        logger.info("%s: inputs %s → key %s (%s)", name, {u: r["key"] for u, r in upstream.items()} or "-", key,
                    "forced" if forced else "artifact present" if valid else "to build")
        task = TASKS[name].with_options(
            cache_policy=cache_policy(name, module.VERSION, cfg.artifacts),
            result_storage=prefect_dir(cfg.artifacts) / "results",
            refresh_cache=forced or not valid,
        )
        options = stage_options(cfg, name)
        state = task(root=store.root, params=key_params, upstream=upstream, force=forced, options=options,
                     return_state=True)
        manifest: Manifest = state.result()
        refs[name] = _ref(manifest)
        headline = _publish(store, name, manifest)
        logger.info("%s [%s] %s: %s", name, state.name, manifest["key"], headline)
        results[name] = {"state": state.name, "key": manifest["key"], "uri": store.artifact_url(name, manifest["key"]),
                         "headline": headline, "build_id": manifest["build_id"]}
    return results


@flow(name="gnnpipe", log_prints=True)
def pipeline(
    artifacts: str = DEFAULTS.artifacts,
    dataset: str = DEFAULTS.dataset,
    num_nodes: int = DEFAULTS.num_nodes,
    avg_degree: float = DEFAULTS.avg_degree,
    num_features: int = DEFAULTS.num_features,
    num_classes: int = DEFAULTS.num_classes,
    seed: int = DEFAULTS.seed,
    split: tuple[float, float, float] = DEFAULTS.split,
    path: str | None = DEFAULTS.path,
    download_dir: str | None = DEFAULTS.download_dir,
    num_partitions: int = DEFAULTS.num_partitions,
    partition_method: str = DEFAULTS.partition_method,
    partition_seed: int = DEFAULTS.partition_seed,
    balance_train: bool = DEFAULTS.balance_train,
    balance_edges: bool = DEFAULTS.balance_edges,
    chunk_rows: int | None = DEFAULTS.chunk_rows,
    compressor: str | None = DEFAULTS.compressor,
    fanouts: list[int] | None = None,
    batch_size: int = DEFAULTS.batch_size,
    hotness_epochs: int = DEFAULTS.hotness_epochs,
    cache_budget_bytes: int | None = DEFAULTS.cache_budget_bytes,
    cache_ratio: float = DEFAULTS.cache_ratio,
    model: str = DEFAULTS.model,
    hidden: int = DEFAULTS.hidden,
    epochs: int = DEFAULTS.epochs,
    lr: float = DEFAULTS.lr,
    dropout: float = DEFAULTS.dropout,
    cache_policy: str = DEFAULTS.cache_policy,
    train_timeout_s: float = DEFAULTS.train_timeout_s,
    host_memory_budget_bytes: int | None = DEFAULTS.host_memory_budget_bytes,
    device: str = DEFAULTS.device,
    until: str = DEFAULTS.until,
    force: list[str] | None = None,
) -> dict[str, Any]:
    """Distributed-GNN data pipeline on partitioned graphs. Parameters: see README ("Parameters")."""
    values = {k: v for k, v in locals().items()}
    values["force"] = force or []
    values["fanouts"] = fanouts or list(DEFAULTS.fanouts)
    return run_pipeline(make_config(**values))
