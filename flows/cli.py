"""``gnnpipe``: run the pipeline or one stage, and inspect what the artifact store holds.

Configuration: built-in defaults ← ``--config FILE`` (YAML or TOML) ← ``--set key=value`` (see ``flows.load``);
``gnnpipe params`` lists every parameter. Errors a user can fix print one line (``error: ...``) and exit 2: commands
raise :class:`~storage.GnnpipeError`, typer's own usage errors (an unknown option, a missing argument, a value of
the wrong type) are click's ``UsageError``, and ``main`` alone turns either into that line.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from flows import api, cli_export, cli_ops, cli_score, cli_store, cli_train, cli_verify, interrupts, terminal
from flows.builds import config_builds
from flows.config import ORDER, STAGES, PipelineConfig, flat_names, flow_parameters, renamed_names
from flows.env import configure_prefect_env
from flows.load import load_config
from flows.locks import tidy
from flows.params_doc import parameter_table
from storage import ArtifactStore, GnnpipeError
from storage.inventory import claim_origin, mark_used

HELP = ("Run the pipeline or one stage, and inspect what the artifact store holds.\n\n"
        "Configuration: built-in defaults, then --config FILE (YAML or TOML), then --set key=value (repeatable); "
        "`gnnpipe params` lists every parameter. An error you can fix prints one line, `error: ...`, and exits 2.")
# click's exceptions: click's own module, or the copy of click that typer carries from 0.2x on (typer._click)
CLICK_ERRORS: Any = importlib.import_module(typer.BadParameter.__module__)
app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)
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
    found = config_builds(store, cfg)
    if any(f.state != "cached" for f in found.values()):
        return None
    return {name: {"state": "Cached", "key": f.key} for name, f in found.items()}


def _print_results(store: ArtifactStore, results: dict[str, dict[str, Any]]) -> None:
    manifests = {name: store.load(name, res["key"]) for name, res in results.items()}
    reports = {name: STAGES[name].report(manifest) for name, manifest in manifests.items()}
    for name, res in results.items():
        typer.echo(f"{name:<10} {res['state']:<10} {res['key']}  {reports[name].headline}")
    for report in reports.values():
        typer.echo("\n" + report.markdown)


@app.command()
def run(config: Path | None = cli_store.CONFIG,
        until: str | None = typer.Option(None, help=f"last stage to run ({', '.join(ORDER)})"),
        force: list[str] = typer.Option([], "--force", "-f", help="rerun this stage even if cached (repeatable)"),
        set_: list[str] = cli_store.SETS, artifacts: str | None = cli_store.ARTIFACTS,
        no_wait: bool = NO_WAIT) -> None:
    """Run the pipeline; stages whose inputs did not change are taken from the cache."""
    _run(load_config(config, set_, until=until, force=force, artifacts=artifacts, wait=False if no_wait else None))


@app.command()
def stage(name: str = typer.Argument(..., metavar="STAGE", help=f"one of {', '.join(ORDER)}"),
          config: Path | None = cli_store.CONFIG, set_: list[str] = cli_store.SETS,
          artifacts: str | None = cli_store.ARTIFACTS, no_wait: bool = NO_WAIT) -> None:
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


def usage_line(err: Exception) -> str:
    """click's message for ``err`` as the rest of an ``error:`` line, naming the --help that says more (or, for an
    option named like a parameter, the ``--set`` that gives it)."""
    message = " ".join(err.format_message().split()).rstrip(".")   # type: ignore[attr-defined]
    message = message[:1].lower() + message[1:]
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        command = ctx.command_path
    else:   # a parser error may come without its context (a value missing after an option): the command typed
        commands = typer.main.get_command(app).commands   # type: ignore[attr-defined]
        command = " ".join(["gnnpipe", *sys.argv[1:2]]) if sys.argv[1:2] in [[c] for c in commands] else "gnnpipe"
    name = str(getattr(err, "option_name", "") or "").removeprefix("--").replace("-", "_")
    takes_sets = ctx is not None and any(p.name == "set_" for p in ctx.command.params)
    if isinstance(err, CLICK_ERRORS.NoSuchOption) and takes_sets and name in {**flat_names(), **renamed_names()}:
        # click's "Possible options" would point at the wrong ones
        return f"no such option: {err.option_name}; {name} is a parameter: --set {name}=VALUE (`gnnpipe params` " \
               "lists them)"
    return f"{message}; see `{command} --help`"


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the builds this command makes record how it was invoked (`gnnpipe status`); a value the user set wins
    claim_origin(shlex.join(["gnnpipe", *sys.argv[1:]]))
    interrupts.install()
    with terminal.track_stderr():   # the last line starts a line of its own, whatever a progress bar left
        try:
            code = app(prog_name="gnnpipe", standalone_mode=False)   # click's errors come here: one line
            if isinstance(code, int) and code:   # a typer.Exit's code (a command returns None)
                sys.exit(code)
        except CLICK_ERRORS.NoArgsIsHelpError as err:   # a bare `gnnpipe`: typer has printed the help
            sys.exit(err.exit_code)
        except CLICK_ERRORS.ClickException as err:   # an unknown option, a missing argument, a value of the wrong type
            terminal.start_line()
            typer.echo(f"error: {usage_line(err)}", err=True)
            sys.exit(2 if isinstance(err, CLICK_ERRORS.UsageError) else err.exit_code)
        except typer.Abort:   # end of input at a prompt
            terminal.start_line()
            typer.echo("error: aborted", err=True)
            sys.exit(1)
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
