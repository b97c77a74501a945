"""``gnnpipe``: run the pipeline or one stage, and inspect what the artifact store holds.

Configuration: built-in defaults ← ``--config FILE`` (YAML or TOML) ← ``--set key=value`` (YAML-typed values).
Errors a user can fix print one line (``error: ...``) and exit 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from flows.config import ORDER, STAGES, PipelineConfig, make_config
from storage import ArtifactStore, GnnpipeError, InputError
from storage.store import stage_key

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def load_config(config: Optional[Path], sets: list[str], **overrides: Any) -> PipelineConfig:
    values: dict[str, Any] = {}
    if config is not None:
        values.update(_read_config_file(config))
    for item in sets:
        if "=" not in item:
            raise InputError(f"--set expects key=value, got '{item}'")
        key, raw = item.split("=", 1)
        values[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    values.update({k: v for k, v in overrides.items() if v not in (None, [], ())})
    return make_config(**values)


def _read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"config file {path} not found; pass an existing YAML or TOML file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text) or {}
    except Exception as err:  # noqa: BLE001 - any parse error is the user's to fix
        raise InputError(f"cannot parse {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of parameter: value")
    return data


def _fail(err: BaseException) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


def _run(cfg: PipelineConfig) -> None:
    store = ArtifactStore(cfg.artifacts)
    store.check_writable()  # fail before a Prefect server is started for nothing
    from flows.pipeline import pipeline  # imports prefect: only when a run needs it

    results = pipeline(**cfg.model_dump())
    for name, res in results.items():
        typer.echo(f"{name:<10} {res['state']:<10} {res['key']}  {res['headline']}")
    for name in results:
        manifest = store.load(name, results[name]["key"])
        typer.echo("\n" + STAGES[name].report(manifest).markdown)


@app.command()
def run(config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/TOML file of parameters"),
        until: Optional[str] = typer.Option(None, help=f"last stage to run ({', '.join(ORDER)})"),
        force: list[str] = typer.Option([], "--force", "-f", help="rerun this stage even if cached (repeatable)"),
        set_: list[str] = typer.Option([], "--set", "-s", help="parameter override key=value (repeatable)"),
        artifacts: Optional[str] = typer.Option(None, envvar="ARTIFACTS", help="artifact root (path or URL)")
        ) -> None:
    """Run the pipeline; stages whose inputs did not change are taken from the cache."""
    try:
        _run(load_config(config, set_, until=until, force=force, artifacts=artifacts))
    except GnnpipeError as err:
        _fail(err)


@app.command()
def stage(name: str = typer.Argument(..., help=f"one of {', '.join(ORDER)}"),
          config: Optional[Path] = typer.Option(None, "--config", "-c"),
          set_: list[str] = typer.Option([], "--set", "-s"),
          artifacts: Optional[str] = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Rerun one stage, taking its upstream from the cache."""
    try:
        if name not in ORDER:
            raise InputError(f"unknown stage '{name}'; choose one of {', '.join(ORDER)}")
        _run(load_config(config, set_, until=name, force=[name], artifacts=artifacts))
    except GnnpipeError as err:
        _fail(err)


def stage_keys(cfg: PipelineConfig) -> dict[str, str]:
    """Each stage's artifact key for ``cfg``, computed without running anything."""
    keys: dict[str, str] = {}
    for name in cfg.stages():
        module = STAGES[name]
        upstream = {u: {"key": keys[u]} for u in module.UPSTREAM}
        keys[name] = stage_key(name, module.VERSION, cfg.stage_params(name).key_params(), upstream)
    return keys


@app.command()
def status(config: Optional[Path] = typer.Option(None, "--config", "-c"),
           set_: list[str] = typer.Option([], "--set", "-s"),
           artifacts: Optional[str] = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Each stage's key, whether its artifact is built, where, how big, and its summary line."""
    try:
        cfg = load_config(config, set_, artifacts=artifacts)
        store = ArtifactStore(cfg.artifacts)
        for name, key in stage_keys(cfg).items():
            manifest = store.find(name, key)
            if manifest is None:
                typer.echo(f"{name:<10} {key}  missing    {store.artifact_url(name, key)}")
                continue
            size = manifest.get("bytes", 0) / 2**20
            headline = STAGES[name].report(manifest).headline
            typer.echo(f"{name:<10} {key}  built      {store.artifact_url(name, key)}  {size:.1f} MiB  {headline}")
    except GnnpipeError as err:
        _fail(err)


@app.command()
def show(name: str = typer.Argument(...), config: Optional[Path] = typer.Option(None, "--config", "-c"),
         set_: list[str] = typer.Option([], "--set", "-s"),
         artifacts: Optional[str] = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Print a stage's report for the current configuration."""
    try:
        if name not in ORDER:
            raise InputError(f"unknown stage '{name}'; choose one of {', '.join(ORDER)}")
        cfg = load_config(config, set_, artifacts=artifacts)
        key = stage_keys(cfg)[name]
        manifest = ArtifactStore(cfg.artifacts).load(name, key)
        typer.echo(STAGES[name].report(manifest).markdown)
    except GnnpipeError as err:
        _fail(err)


@app.command()
def clean(stage_name: Optional[str] = typer.Option(None, "--stage", help="remove only this stage's artifacts"),
          artifacts: Optional[str] = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Delete artifacts (all, or one stage's) and the Prefect cache records that point at them."""
    try:
        cfg = load_config(None, [], artifacts=artifacts)
        store = ArtifactStore(cfg.artifacts)
        if stage_name is not None:
            if stage_name not in ORDER:
                raise InputError(f"unknown stage '{stage_name}'; choose one of {', '.join(ORDER)}")
            store.remove(stage_name)
        else:
            for name in (*ORDER, ".prefect"):
                store.remove(name)
        typer.echo(f"removed {store.url(stage_name) if stage_name else store.root + ' (all stages)'}")
    except GnnpipeError as err:
        _fail(err)


def _register_ops() -> None:
    from flows import cli_ops, cli_train

    cli_ops.register(app)
    cli_train.register(app)


_register_ops()


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        app()
    except GnnpipeError as err:  # errors raised while typer parses
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
