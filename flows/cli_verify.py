"""``gnnpipe verify [STAGE]``: re-read builds against the sizes and checksums their manifests recorded
(``storage.verify``), one line per build, and name the command that rebuilds each damaged one.

Which builds: without ``--config``/``--set`` every build the root holds (what ``gnnpipe status`` lists), with them
that config's; STAGE narrows either to one stage. Damage is a user-fixable error: one ``error:`` line (raised as
:class:`~storage.ArtifactError`, printed by ``flows.cli.main``, exit 2) naming each damaged build and its rebuild.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from flows.cli_store import ARTIFACTS, CONFIG, SETS, check_stage, cli_args, open_root
from flows.config import ORDER, stage_keys
from flows.load import load_config
from storage import ArtifactError, ArtifactStore
from storage import inventory as inv
from storage.verify import Verdict, verify_build
from storage.zarr_io import rerun_hint

# the options of `gnnpipe run|stage` that decide what a build is (its keys), by every name they take
_BUILD_OPTIONS = {"--config": "--config", "-c": "--config", "--set": "--set", "-s": "--set"}
_SHOWN = 3   # size-checked-only files named on a build's line; the rest counted


def built_with(origin: str) -> list[str] | None:
    """The --config/--set of ``origin``, a manifest's record of the command that built it, if that was a
    ``gnnpipe run|stage`` command line; None if it was something else (a deployment's flow run) or nothing."""
    try:
        words = shlex.split(origin)
    except ValueError:
        return None
    if words[:1] != ["gnnpipe"] or words[1:2] not in (["run"], ["stage"]):
        return None
    out: list[str] = []
    rest = iter(words[2:])
    for word in rest:
        option, eq, value = word.partition("=")
        if option in _BUILD_OPTIONS:
            out += [_BUILD_OPTIONS[option], value if eq else next(rest, "")]
    return out


def _rebuild_with(verdict: Verdict, given: list[str] | None, artifacts: str | None) -> str:
    """``rerun_hint``'s args: the --config/--set verify was given, else those of the command that built it."""
    if given is not None:
        return f"`{shlex.join(given)}`" if given else "no --config/--set"
    origin = verdict.manifest.origin if verdict.manifest else ""
    args = built_with(origin)
    if args is None:
        return "the --config/--set that built it" + (f" ({origin})" if origin else "")
    args += ["--artifacts", artifacts] if artifacts else []
    return f"`{shlex.join(args)}`, the --config/--set that built it" if args else "no --config/--set, as it was built"


def _line(verdict: Verdict) -> str:
    head = f"{verdict.stage:<10} {verdict.key}  "
    if not verdict.ok:
        return f"{head}DAMAGED  {verdict.damage}"
    if not verdict.size_only:
        return f"{head}ok"
    named = ", ".join(verdict.size_only[:_SHOWN])
    more = len(verdict.size_only) - _SHOWN
    return (f"{head}ok, but {len(verdict.size_only)} files size-checked only (its manifest records no checksum for "
            f"them): {named}{f' and {more} more' if more > 0 else ''}")


def _root_builds(store: ArtifactStore, name: str | None) -> list[tuple[str, str]]:
    """Every build directory of the root (of stage ``name``), as ``gnnpipe status`` lists them."""
    found = [(b.stage, b.key) for s in ([name] if name else ORDER) for b in inv.builds(store, s)]
    if not found:
        typer.echo(f"artifact root {store.root} holds no {name + ' ' if name else ''}builds: nothing to verify")
    return found


def verify(name: str | None = typer.Argument(None, metavar="STAGE",
                                             help=f"only this stage's builds ({', '.join(ORDER)})"),
           config: Path | None = CONFIG, set_: list[str] = SETS, artifacts: str | None = ARTIFACTS) -> None:
    """Re-read builds (all, a config's with --config/--set, one stage's with STAGE): every file against the size
    and checksum its manifest recorded, every Zarr chunk through its crc32c. Names the command that rebuilds a
    damaged one."""
    if name is not None:
        check_stage(name)
    given: list[str] | None = None   # the --config/--set to rebuild with, when the user named a config
    # a directory without a manifest is no build (a run would not take it from the cache): nothing to damage
    absent = "skipped: no manifest (being written, or left by a killed run)"
    if config is None and not set_:
        store, exists = open_root(artifacts)
        if not exists:
            typer.echo(f"artifact root {store.root} does not exist: nothing to verify")
        targets = _root_builds(store, name) if exists else []
    else:
        cfg = load_config(config, set_, artifacts=artifacts)
        keys = stage_keys(cfg.model_copy(update={"until": name}) if name else cfg)
        store = ArtifactStore(cfg.artifacts)
        inv.check_root(store)
        targets = [(name, keys[name])] if name else list(keys.items())
        given, absent = cli_args(config, set_, artifacts), "not built for this config"
    damaged = []
    for stage, key in targets:
        if not inv.has_manifest(store, stage, key):
            typer.echo(f"{stage:<10} {key}  {absent}")
            continue
        verdict = verify_build(store, stage, key)
        typer.echo(_line(verdict))
        if not verdict.ok:
            damaged.append(verdict)
    if not damaged:
        return
    hints = [f"{v.stage} {v.key} is damaged: "
             f"{rerun_hint(store.url(v.stage, v.key), _rebuild_with(v, given, artifacts))}" for v in damaged]
    # a downstream build's key is made of its parameters and its upstream's key, never of the data it read
    raise ArtifactError("; ".join(hints) + ". The builds downstream of it keep their keys: they stay valid only if "
                        "the rebuild is byte-identical (a stage that is not reproducible rebuilds them itself), else "
                        "force them too")


def register(app: typer.Typer) -> None:
    app.command()(verify)
