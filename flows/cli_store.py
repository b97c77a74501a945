"""``gnnpipe status|show|clean``: what the artifact root holds, one build's report, and removing builds.

``status`` without ``--config``/``--set`` lists the root as it is (every stage's builds, whatever config made them);
with them, whether that config's stages are cached. ``clean`` removes the train checkpoints with the train builds:
a later run would otherwise resume from them. User errors are raised as :class:`~storage.GnnpipeError`;
``flows.cli.main`` prints them as one line.
"""

from __future__ import annotations

import datetime as _dt
import shlex
import shutil
from pathlib import Path

import typer

from flows import locks
from flows.builds import config_builds
from flows.config import ORDER, STAGES, PipelineConfig, stage_keys
from flows.load import load_config
from flows.records import locks_dir, prefect_dir
from stages.params import as_typed
from stages.train.spec import checkpoints_of_other_builds
from storage import ArtifactStore, InputError, Manifest, leftovers
from storage import inventory as inv
from storage.reach import remove_tokens
from storage.train import checkpoint_dirs, job_checkpoints, remove_checkpoints

CONFIG = typer.Option(None, "--config", "-c", help="YAML/TOML file of parameters")
SETS = typer.Option([], "--set", "-s", help="parameter override key=value (repeatable)")
ARTIFACTS = typer.Option(None, envvar="ARTIFACTS", help="artifact root (path or URL)")
BUILD_KEY = typer.Argument(None, metavar="KEY", help="a build's key or its first characters (gnnpipe status)")


def check_stage(name: str) -> None:
    if name not in ORDER:
        raise InputError(f"unknown stage '{name}'; choose one of {', '.join(ORDER)}")


def open_root(artifacts: str | None) -> tuple[ArtifactStore, bool]:
    """The store of ``artifacts`` (or the default root) and whether it exists; a file there is an error."""
    store = ArtifactStore(load_config(None, [], artifacts=artifacts).artifacts)
    return store, inv.check_root(store)


# ---- formatting ----------------------------------------------------------------------------------------------------
def size(num: int) -> str:
    if num < 1024:
        return f"{num} B"
    value = float(num)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def when(iso: str | None) -> str:
    """An ISO time (UTC) as local ``YYYY-MM-DD HH:MM``; ``-`` if unknown."""
    if not iso:
        return "-"
    try:
        return _dt.datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


def short_params(manifest: Manifest) -> str:
    """The build's parameters that differ from today's defaults (``num_nodes=3000 epochs=5``)."""
    module = STAGES[manifest.stage]
    defaults = module.Params().key_params()
    diff = [f"{k}={as_typed(v)}" for k, v in manifest.params.items() if k not in defaults or defaults[k] != v]
    if manifest.version != module.VERSION:   # never reused: a run computes this stage's key with today's VERSION
        diff.append(f"[stage version {manifest.version}, now {module.VERSION}: not reused]")
    return " ".join(diff) or "(defaults)"


def built_on(manifest: Manifest) -> str:
    """The build's nearest upstream (it fixes the others: train's hotness names its features and partition)."""
    upstream = STAGES[manifest.stage].UPSTREAM
    return f"{upstream[-1]} {manifest.upstream.get(upstream[-1], '?')[:8]}" if upstream else "-"


def table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Rows aligned in columns (the last one unpadded)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [indent + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in rows]


HEADER = ["KEY", "SIZE", "CREATED", "LAST USED", "BUILT ON", "PARAMS", "ORIGIN"]


def _build_row(build: inv.Build) -> list[str]:
    m = build.manifest
    if m is None:
        return [build.key, "-", "-", "-", "-", f"unusable: {build.problem}", ""]
    return [m.key, size(m.bytes), when(m.created), when(build.last_used), built_on(m), short_params(m),
            m.origin or "-"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _epochs_done(job: Path) -> str:
    found = job_checkpoints(job)
    # checkpoint e is taken after 0-based epoch e: ckpt-00002.pt means 3 epochs done
    return f"{_plural(max(e for e, _ in found) + 1, 'epoch')} done" if found else "no checkpoint yet"


def _checkpoint_lines(store: ArtifactStore) -> list[str]:
    jobs = checkpoint_dirs(store)
    if not jobs:
        return []
    lines = ["  unfinished train jobs (a run with the same parameters resumes from their checkpoints; "
             "`gnnpipe clean --stage train` removes them):"]
    for key, path in jobs.items():
        total = sum(p.stat().st_size for _, p in job_checkpoints(path))
        lines.append(f"    {key}  {_epochs_done(path)}, {size(total)}  {path}")
    return lines


# ---- status --------------------------------------------------------------------------------------------------------
def list_root(store: ArtifactStore) -> list[str]:
    """Every stage's builds, one aligned line each under a header per stage."""
    out: list[str] = []
    count, total = 0, 0
    for name in ORDER:
        found, partial = inv.builds(store, name), inv.unfinished(store, name)
        ckpts = _checkpoint_lines(store) if name == "train" else []
        count += len(found)
        total += sum(b.manifest.bytes for b in found if b.manifest)
        out.append("")
        out.append(f"{name}: {_plural(len(found), 'build')}")
        if found:
            out.extend(table([HEADER, *(_build_row(b) for b in found)]))
        out.extend(f"  {store.url(name, p)}: being written, or left by a killed run" for p in partial)
        out.extend(ckpts)
    head = f"artifact root {store.root}: {_plural(count, 'build')}, {size(total)}"
    hint = ["", "`gnnpipe show STAGE KEY` prints a build's report; `gnnpipe status --config/--set` says what a "
                "config would take from the cache"]
    return [head, *out, *hint]


def config_status(store: ArtifactStore, cfg: PipelineConfig) -> list[str]:
    """Per stage of ``cfg``: its key, ``cached``, ``stale`` (``flows.builds``) or ``missing``, where, and the
    summary line."""
    lines = []
    ckpts = checkpoint_dirs(store)
    for name, found in config_builds(store, cfg).items():
        key, manifest = found.key, found.manifest
        if manifest is not None:
            headline = f"rests on another build of {', '.join(found.changed)}: a run rebuilds it" \
                if found.state == "stale" else STAGES[name].report(manifest).headline
            lines.append(f"{name:<10} {key}  {found.state:<10} {store.url(name, key)}  "
                         f"{manifest.bytes / 2**20:.1f} MiB  {headline}")
            continue
        note = ""
        if name == "train" and key in ckpts:
            then = "a run starts afresh: they were taken on other builds" \
                if checkpoints_of_other_builds(ckpts[key], found.behind) else "a run resumes"
            note = f"  (checkpoints: {_epochs_done(ckpts[key])}; {then})"
        lines.append(f"{name:<10} {key}  missing    {store.url(name, key)}{note}")
    return lines


def status(config: Path | None = CONFIG, set_: list[str] = SETS, artifacts: str | None = ARTIFACTS) -> None:
    """What the artifact root holds; with --config/--set, whether that config's stages are cached or missing."""
    if config is None and not set_:
        store, exists = open_root(artifacts)
        if not exists:
            typer.echo(f"artifact root {store.root} does not exist: nothing built yet (`gnnpipe run` builds the "
                       f"pipeline)")
            return
        typer.echo("\n".join(list_root(store)))
        return
    cfg = load_config(config, set_, artifacts=artifacts)
    store = ArtifactStore(cfg.artifacts)
    inv.check_root(store)
    typer.echo("\n".join(config_status(store, cfg)))


# ---- show ----------------------------------------------------------------------------------------------------------
def _by_prefix(store: ArtifactStore, name: str, prefix: str) -> str:
    keys = [b.key for b in inv.builds(store, name) if b.key.startswith(prefix)]
    if len(keys) == 1:
        return keys[0]
    if not keys:
        raise InputError(f"no {name} build {prefix} in {store.root}; `gnnpipe status --artifacts {store.root}` "
                         f"lists the builds")
    raise InputError(f"{prefix} names {len(keys)} {name} builds ({', '.join(keys)}); give more of the key")


def cli_args(config: Path | None, set_: list[str], artifacts: str | None) -> list[str]:
    """A command's --config/--set/--artifacts as a later command takes them."""
    args = ["--config", str(config)] if config else []
    return args + [a for s in set_ for a in ("--set", s)] + (["--artifacts", artifacts] if artifacts else [])


def _run_command(name: str, config: Path | None, set_: list[str], artifacts: str | None) -> str:
    return shlex.join(["gnnpipe", "run", "--until", name, *cli_args(config, set_, artifacts)])


def _default_choice(store: ArtifactStore, name: str, key: str) -> str:
    """No key and no config: the default config's build if there is one, else the stage's only build."""
    if inv.has_manifest(store, name, key):
        return key
    found = [b.key for b in inv.builds(store, name)]
    if len(found) == 1:
        typer.echo(f"note: using {name} {found[0]}, the only {name} build in {store.root}", err=True)
        return found[0]
    if found:
        raise InputError(f"{name} has {len(found)} builds in {store.root} and none is the default config's; pick "
                         f"one: `gnnpipe show {name} KEY` (keys: {', '.join(found)}), or pass its --config/--set")
    return key


def show(name: str = typer.Argument(..., metavar="STAGE", help=f"one of {', '.join(ORDER)}"),
         key: str | None = BUILD_KEY,
         config: Path | None = CONFIG, set_: list[str] = SETS, artifacts: str | None = ARTIFACTS) -> None:
    """Print a stage's report: of build KEY, of the config given, or of the stage's only build."""
    store, manifest = find_build(name, key, config, set_, artifacts)
    typer.echo(STAGES[name].report(manifest).markdown)


def find_build(name: str, key: str | None, config: Path | None, set_: list[str],
               artifacts: str | None) -> tuple[ArtifactStore, Manifest]:
    """The build of stage ``name`` that ``gnnpipe show`` picks (``gnnpipe export`` too): KEY or its prefix, the
    config's, or the stage's only build; an InputError saying how to build or pick it otherwise."""
    check_stage(name)
    if key is not None and (config is not None or set_):
        raise InputError("pass a build's KEY or a --config/--set, not both")
    cfg = load_config(config, set_, artifacts=artifacts)
    store = ArtifactStore(cfg.artifacts)
    inv.check_root(store)
    if key is not None:
        chosen = _by_prefix(store, name, key)
    else:
        chosen = stage_keys(cfg.model_copy(update={"until": name}))[name]
        if config is None and not set_:
            chosen = _default_choice(store, name, chosen)
        elif (found := config_builds(store, cfg.model_copy(update={"until": name}))[name]).state == "stale":
            raise InputError(f"{name} {chosen} in {store.root} rests on another build of {', '.join(found.changed)} "
                             f"than this config's: rerun the pipeline to rebuild it: "
                             f"{_run_command(name, config, set_, artifacts)}")
    if not inv.has_manifest(store, name, chosen):
        raise InputError(f"{name} {chosen} is missing from {store.root} (not built for this config); rerun the "
                         f"pipeline to build it: {_run_command(name, config, set_, artifacts)}")
    return store, store.load(name, chosen)


# ---- clean ---------------------------------------------------------------------------------------------------------
def _remove_stage(store: ArtifactStore, name: str) -> list[str]:
    lines = []
    found = inv.builds(store, name)
    if found or inv.unfinished(store, name):
        nbytes = inv.size_of(store, name)
        store.remove(name)
        lines.append(f"removed {store.url(name)} ({_plural(len(found), 'build')}, {size(nbytes)})")
    inv.remove_used(store, name)
    if name == "train":
        lines += [f"removed {path} (train checkpoints)" for path in remove_checkpoints(store)]
    lines += [f"removed {path} (left by a killed run)" for path in leftovers.remove_jobs(store, name)]
    return lines


def _remove_cache_records(store: ArtifactStore, name: str | None) -> list[str]:
    """Prefect's cache records (``flows.records.prefect_dir``, ``<stage>-<key>`` files) of the removed builds, and
    the stage locks whose holder is dead; a live run's lock stays, named."""
    base = prefect_dir(store.root)
    if not base.exists():
        return []
    stale, live = locks.remove_stale(locks_dir(store.root), name)
    lines = [f"kept the lock of a run still building {locks.stage_of(path.name)}: {holder.describe()}"
             for path, holder in live]
    if name is None and not live:
        shutil.rmtree(base)
        return [f"removed {base} (Prefect cache records)"]
    records = list((base / "cache-keys").glob(f"{name or ''}*-*"))
    for path in records:
        path.unlink(missing_ok=True)
    if records:
        lines.append(f"removed {_plural(len(records), 'Prefect cache record')}" + (f" of {name}" if name else ""))
    if stale:
        lines.append(f"removed {_plural(stale, 'stale lock')} (their runs were killed)")
    return lines


def clean(stage_name: str | None = typer.Option(None, "--stage", help="remove only this stage's builds"),
          artifacts: str | None = ARTIFACTS) -> None:
    """Delete builds (all, or one stage's; train's with its checkpoints) and the cache records that point at them."""
    if stage_name is not None:
        check_stage(stage_name)
    store, exists = open_root(artifacts)
    if not exists:
        typer.echo(f"nothing to remove: {store.root} does not exist")
        return
    lines: list[str] = []
    for name in [stage_name] if stage_name else ORDER:
        lines += _remove_stage(store, name)
    lines += _remove_cache_records(store, stage_name)
    if stage_name is None:
        inv.remove_used(store)
        lines += [f"removed {url} (left by a run killed while it checked that Dask workers reach the root)"
                  for url in remove_tokens(store)]
    typer.echo("\n".join(lines) if lines else f"nothing to remove in {store.root}")


def register(app: typer.Typer) -> None:
    app.command()(status)
    app.command()(show)
    app.command()(clean)

