"""``gnnpipe``: run the pipeline or one stage, and inspect what the artifact store holds.

Configuration: built-in defaults ← ``--config FILE`` (YAML or TOML) ← ``--set key=value`` (see ``flows.load``);
``gnnpipe params`` lists every parameter. Errors a user can fix print one line (``error: ...``) and exit 2: commands
raise :class:`~storage.GnnpipeError`, and ``main`` alone turns it into that line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from flows import cli_ops, cli_train
from flows.config import ORDER, STAGES, PipelineConfig, flow_parameters, stage_keys
from flows.load import load_config
from flows.params_doc import parameter_table
from storage import ArtifactStore, GnnpipeError, InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _run(cfg: PipelineConfig) -> None:
    store = ArtifactStore(cfg.artifacts)
    store.check_writable()  # fail before a Prefect server is started for nothing
    for note in cfg.notes():
        typer.echo(f"note: {note}", err=True)
    from flows.pipeline import pipeline  # imports prefect: only when a run needs it

    results = pipeline(**flow_parameters(cfg))
    for name, res in results.items():
        typer.echo(f"{name:<10} {res['state']:<10} {res['key']}  {res['headline']}")
    for name in results:
        manifest = store.load(name, results[name]["key"])
        typer.echo("\n" + STAGES[name].report(manifest).markdown)


def _check_stage(name: str) -> None:
    if name not in ORDER:
        raise InputError(f"unknown stage '{name}'; choose one of {', '.join(ORDER)}")


@app.command()
def run(config: Path | None = typer.Option(None, "--config", "-c", help="YAML/TOML file of parameters"),
        until: str | None = typer.Option(None, help=f"last stage to run ({', '.join(ORDER)})"),
        force: list[str] = typer.Option([], "--force", "-f", help="rerun this stage even if cached (repeatable)"),
        set_: list[str] = typer.Option([], "--set", "-s", help="parameter override key=value (repeatable)"),
        artifacts: str | None = typer.Option(None, envvar="ARTIFACTS", help="artifact root (path or URL)")
        ) -> None:
    """Run the pipeline; stages whose inputs did not change are taken from the cache."""
    _run(load_config(config, set_, until=until, force=force, artifacts=artifacts))


@app.command()
def stage(name: str = typer.Argument(..., help=f"one of {', '.join(ORDER)}"),
          config: Path | None = typer.Option(None, "--config", "-c"),
          set_: list[str] = typer.Option([], "--set", "-s"),
          artifacts: str | None = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Rerun one stage, taking its upstream from the cache."""
    _check_stage(name)
    _run(load_config(config, set_, until=name, force=[name], artifacts=artifacts))


@app.command()
def status(config: Path | None = typer.Option(None, "--config", "-c"),
           set_: list[str] = typer.Option([], "--set", "-s"),
           artifacts: str | None = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Each stage's key, whether its artifact is built, where, how big, and its summary line."""
    cfg = load_config(config, set_, artifacts=artifacts)
    store = ArtifactStore(cfg.artifacts)
    for name, key in stage_keys(cfg).items():
        manifest = store.find(name, key)
        if manifest is None:
            typer.echo(f"{name:<10} {key}  missing    {store.url(name, key)}")
            continue
        headline = STAGES[name].report(manifest).headline
        typer.echo(f"{name:<10} {key}  built      {store.url(name, key)}  {manifest.bytes / 2**20:.1f} MiB  "
                   f"{headline}")


@app.command()
def show(name: str = typer.Argument(...), config: Path | None = typer.Option(None, "--config", "-c"),
         set_: list[str] = typer.Option([], "--set", "-s"),
         artifacts: str | None = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Print a stage's report for the current configuration."""
    _check_stage(name)
    cfg = load_config(config, set_, artifacts=artifacts)
    manifest = ArtifactStore(cfg.artifacts).load(name, stage_keys(cfg.model_copy(update={"until": name}))[name])
    typer.echo(STAGES[name].report(manifest).markdown)


@app.command()
def clean(stage_name: str | None = typer.Option(None, "--stage", help="remove only this stage's artifacts"),
          artifacts: str | None = typer.Option(None, envvar="ARTIFACTS")) -> None:
    """Delete artifacts (all, or one stage's) and the Prefect cache records that point at them."""
    cfg = load_config(None, [], artifacts=artifacts)
    store = ArtifactStore(cfg.artifacts)
    if stage_name is not None:
        _check_stage(stage_name)
        store.remove(stage_name)
    else:
        for name in (*ORDER, ".prefect"):
            store.remove(name)
    typer.echo(f"removed {store.url(stage_name) if stage_name else store.root + ' (all stages)'}")


@app.command()
def params(markdown: bool = typer.Option(False, "--markdown", help="the README's table")) -> None:
    """Every parameter: its names, stage, type, default and meaning (derived from the stages' Params)."""
    typer.echo(parameter_table(markdown=markdown))


cli_ops.register(app)
cli_train.register(app)


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        app()
    except GnnpipeError as err:   # every command's user errors, and those raised while typer parses
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
