"""``gnnpipe``: run the pipeline or one stage, and inspect what the artifact store holds.

Configuration: built-in defaults ← ``--config FILE`` (YAML or TOML) ← ``--set key=value`` (see ``flows.load``);
``gnnpipe params`` lists every parameter. Errors a user can fix print one line (``error: ...``) and exit 2: commands
raise :class:`~storage.GnnpipeError`, and ``main`` alone turns it into that line.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from flows import api, cli_export, cli_ops, cli_score, cli_store, cli_train, cli_verify, interrupts, terminal
from flows.config import ORDER, STAGES, PipelineConfig, flow_parameters, stage_keys
from flows.env import configure_prefect_env
from flows.load import load_config
from flows.locks import tidy
from flows.params_doc import parameter_table
from storage import ArtifactStore, GnnpipeError
from storage.inventory import claim_origin, mark_used

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
NO_WAIT = typer.Option(False, "--no-wait", help="fail at once if another live run is building a stage this run needs, "
                                                "instead of waiting for it (the `wait` parameter)")


def _run(cfg: PipelineConfig) -> None:
    store = ArtifactStore(cfg.artifacts)
    store.check_writable()  # fail before a Prefect server is started for nothing
    for note in cfg.notes():
        typer.echo(f"note: {note}", err=True)
    configure_prefect_env()
    url = api.running_api()
    if url is None and (cached := _all_cached(cfg, store)) is not None:
        # nothing to compute and no server to record a flow run in: starting a temporary one would cost 8-10 s of
        # this box's 10-14 s flow path (benchmarks/RESULTS.md), for nothing
        for name, res in cached.items():
            mark_used(store, name, res["key"])   # `gnnpipe status`'s "last used"
            for path in tidy(store.root, name, res["key"]):
                typer.echo(f"note: {name}: removed {path}, left by an earlier attempt at this build", err=True)
        _print_results(store, cached)
        typer.echo("note: every stage is cached, so nothing ran and no Prefect flow run was recorded; with a server "
                   "up (`make server-up`, or PREFECT_API_URL set) runs are recorded there", err=True)
        return
    with api.prefect_api(url):
        from flows import quiet
        from flows.pipeline import pipeline  # imported by prefect_api, with PREFECT_API_URL set

        quiet.install()   # this terminal shows a user's error once, as the `error:` line (flows/quiet.py)
        results = pipeline(**flow_parameters(cfg))
    _print_results(store, results)


def _all_cached(cfg: PipelineConfig, store: ArtifactStore) -> dict[str, dict[str, Any]] | None:
    """Each stage's result as the flow would report it, if all are in the store and none is forced; else None."""
    if cfg.force:
        return None
    results: dict[str, dict[str, Any]] = {}
    for name, key in stage_keys(cfg).items():
        if store.find(name, key) is None:
            return None
        results[name] = {"state": "Cached", "key": key}
    return results


def _print_results(store: ArtifactStore, results: dict[str, dict[str, Any]]) -> None:
    manifests = {name: store.load(name, res["key"]) for name, res in results.items()}
    reports = {name: STAGES[name].report(manifest) for name, manifest in manifests.items()}
    for name, res in results.items():
        typer.echo(f"{name:<10} {res['state']:<10} {res['key']}  {reports[name].headline}")
    for report in reports.values():
        typer.echo("\n" + report.markdown)


@app.command()
def run(config: Path | None = typer.Option(None, "--config", "-c", help="YAML/TOML file of parameters"),
        until: str | None = typer.Option(None, help=f"last stage to run ({', '.join(ORDER)})"),
        force: list[str] = typer.Option([], "--force", "-f", help="rerun this stage even if cached (repeatable)"),
        set_: list[str] = typer.Option([], "--set", "-s", help="parameter override key=value (repeatable)"),
        artifacts: str | None = typer.Option(None, envvar="ARTIFACTS", help="artifact root (path or URL)"),
        no_wait: bool = NO_WAIT) -> None:
    """Run the pipeline; stages whose inputs did not change are taken from the cache."""
    _run(load_config(config, set_, until=until, force=force, artifacts=artifacts, wait=False if no_wait else None))


@app.command()
def stage(name: str = typer.Argument(..., help=f"one of {', '.join(ORDER)}"),
          config: Path | None = typer.Option(None, "--config", "-c"),
          set_: list[str] = typer.Option([], "--set", "-s"),
          artifacts: str | None = typer.Option(None, envvar="ARTIFACTS"),
          no_wait: bool = NO_WAIT) -> None:
    """Rerun one stage, taking its upstream from the cache."""
    cli_store.check_stage(name)
    _run(load_config(config, set_, until=name, force=[name], artifacts=artifacts, wait=False if no_wait else None))


@app.command()
def params(markdown: bool = typer.Option(False, "--markdown", help="the README's table")) -> None:
    """Every parameter: its names, stage, type, default and meaning (derived from the stages' Params)."""
    typer.echo(parameter_table(markdown=markdown))


cli_ops.register(app)
cli_store.register(app)
cli_verify.register(app)
cli_train.register(app)
cli_export.register(app)
cli_score.register(app)


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the builds this command makes record how it was invoked (`gnnpipe status`); a value the user set wins
    claim_origin(shlex.join(["gnnpipe", *sys.argv[1:]]))
    interrupts.install()
    with terminal.track_stderr():   # the last line starts a line of its own, whatever a progress bar left
        try:
            app()
        except GnnpipeError as err:   # every command's user errors, and those raised while typer parses
            terminal.start_line()
            typer.echo(f"error: {err}", err=True)
            sys.exit(2)
        except interrupts.Interrupted as exc:   # SIGINT or SIGTERM, after every process of the run was stopped
            terminal.start_line()
            typer.echo(interrupts.message(exc, interrupts.interrupted_stage(exc)), err=True)
            sys.exit(exc.exit_code)
        except Exception as err:   # an interruption that a library wrapped in an error of its own, or a real error
            if (stopped := interrupts.interruption(err)) is None:
                raise
            terminal.start_line()
            typer.echo(interrupts.message(stopped, interrupts.interrupted_stage(stopped)), err=True)
            sys.exit(stopped.exit_code)


if __name__ == "__main__":
    main()
