"""``gnnpipe server|worker|deploy``: the Prefect server, a process worker and the deployments of prefect.yaml.

User errors are raised as :class:`~storage.GnnpipeError`; ``flows.cli.main`` prints them as one line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import typer

from flows import services
from storage import GnnpipeError

REPO = Path(__file__).resolve().parents[1]


def _url(port: int) -> str:
    return os.environ.get("PREFECT_API_URL") or services.api_url(services.DEFAULT_HOST, port)


PORT = typer.Option(services.DEFAULT_PORT, envvar="PREFECT_PORT", help="the server's port on 127.0.0.1")
server_app = typer.Typer(help="A local Prefect server (UI at http://127.0.0.1:PORT).", no_args_is_help=True)
worker_app = typer.Typer(help="A process worker for the gnnpipe-local pool.", no_args_is_help=True)


@server_app.command("up")
def server_up(port: int = PORT) -> None:
    """Start the server in the background (one at a time), wait until it answers, and print the PREFECT_API_URL
    to export."""
    url = services.server_up(services.DEFAULT_HOST, port)
    typer.echo(f"Prefect server at {url} (UI: {url.removesuffix('/api')}), log {services.log_file('server')}")
    typer.echo(f"export PREFECT_API_URL={url}")


@server_app.command("down")
def server_down() -> None:
    """Stop the server this command started."""
    typer.echo("server stopped" if services.stop("server") else "no server running")


@worker_app.command("up")
def worker_up(port: int = PORT, pool: str = typer.Option(services.POOL, help="the work pool to poll")) -> None:
    """Start a process worker in the background: it runs the deployments' flow runs (`prefect deployment run`)."""
    pid = services.worker_up(_url(port), pool)
    typer.echo(f"worker pid {pid} polling pool {pool}, log {services.log_file('worker')}")


@worker_app.command("down")
def worker_down() -> None:
    """Stop the worker this command started."""
    typer.echo("worker stopped" if services.stop("worker") else "no worker running")


def deploy(port: int = PORT) -> None:
    """Register every deployment of prefect.yaml (gnnpipe/default, gnnpipe/ogbn-products, ...)."""
    env = {**os.environ, "PREFECT_API_URL": _url(port)}
    services.ensure_pool(env["PREFECT_API_URL"])
    proc = subprocess.run([services.prefect_exe(), "--no-prompt", "deploy", "--all"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise GnnpipeError(f"prefect deploy failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1]}")
    typer.echo("deployed: " + ", ".join(ln.split("'")[1] for ln in proc.stdout.splitlines()
                                         if "Deployment '" in ln and "successfully created" in ln))


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")
    app.add_typer(worker_app, name="worker")
    app.command("deploy")(deploy)
