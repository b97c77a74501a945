"""What an artifact root holds, who built each build and when a run last used it (``gnnpipe status`` / ``clean``).

Two records beside the content-addressed builds, neither part of any build (a build's validity is its manifest and
the files the manifest lists; these records can never make one look incomplete, see ``storage.store``):

- ``Manifest.origin``: how the run that built it was invoked, taken from the ``GNNPIPE_ORIGIN`` environment
  variable when the manifest is written. The CLI sets it before a run (``claim_origin``); the flow sets it from
  its flow run when started by a deployment (``building_for``), whatever the worker's environment holds.
  Environment, not a parameter: it reaches Prefect tasks and the processes they start without touching a stage's
  signature, and it never enters a key.
- ``<root>/.last-used/<stage>/<key>``: ``{"at": ISO time, "by": origin}``, rewritten by ``mark_used`` each time a
  run builds a stage or takes it from the cache. Outside the stage directories, so that listing a stage, publishing
  a build and removing one never meet it. A best-effort record: failing to write it never fails a run.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from storage.errors import ArtifactError, InputError
from storage.store import MANIFEST, ArtifactStore, Manifest

ORIGIN_ENV = "GNNPIPE_ORIGIN"
ORIGIN_PID_ENV = "GNNPIPE_ORIGIN_PID"   # the process ORIGIN_ENV was claimed for (claim_origin)
USED_DIR = ".last-used"
TMP_PREFIX = ".tmp-"   # storage.store.ArtifactStore.writing's work directories


def current_origin() -> str:
    """How the running pipeline was invoked (``""`` when nobody said)."""
    return os.environ.get(ORIGIN_ENV, "")


def claim_origin(command: str) -> None:
    """This process runs ``command``: its builds record it (a value already in ``ORIGIN_ENV``, the user's, wins).
    The claim names this process's id, because the environment is inherited by processes that are not running
    ``command``: a Prefect process worker started by ``gnnpipe worker up`` runs each deployment's flow in a child
    that would otherwise record ``gnnpipe worker up`` (``own_origin``)."""
    os.environ.setdefault(ORIGIN_ENV, command)
    os.environ[ORIGIN_PID_ENV] = str(os.getpid())


def own_origin() -> str:
    """``ORIGIN_ENV`` if it was claimed for this very process (``claim_origin``), else ``""``."""
    if os.environ.get(ORIGIN_PID_ENV) != str(os.getpid()):
        return ""
    return os.environ.get(ORIGIN_ENV, "")


@contextmanager
def building_for(origin: str) -> Iterator[None]:
    """Builds made inside this block record ``origin``; the previous value is restored after."""
    before = os.environ.get(ORIGIN_ENV)
    os.environ[ORIGIN_ENV] = origin
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ORIGIN_ENV, None)
        else:
            os.environ[ORIGIN_ENV] = before


def _used_path(store: ArtifactStore, stage: str, key: str | None = None) -> str:
    parts = [store.base, USED_DIR, stage] + ([key] if key else [])
    return "/".join(parts)


def mark_used(store: ArtifactStore, stage: str, key: str) -> None:
    """Record that a run used ``stage/key`` now (built it or took it from the cache)."""
    record = {"at": _now(), "by": current_origin()}
    try:
        store.fs.makedirs(_used_path(store, stage), exist_ok=True)
        store.fs.pipe_file(_used_path(store, stage, key), json.dumps(record).encode())
    except Exception:  # noqa: BLE001 - a bookkeeping record (a full disk, a read-only bucket) must not fail a run
        pass


def last_used(store: ArtifactStore, stage: str, key: str) -> str | None:
    """When a run last used ``stage/key`` (ISO time, UTC), or None if no run recorded it."""
    try:
        record = json.loads(store.fs.cat_file(_used_path(store, stage, key)))
        return str(record["at"])
    except Exception:  # noqa: BLE001 - absent, half-written or foreign: all mean "not known"
        return None


def remove_used(store: ArtifactStore, stage: str | None = None) -> bool:
    """Forget the last-use records of one stage (or of all); True if there were any."""
    path = _used_path(store, stage) if stage else "/".join([store.base, USED_DIR])
    if not store.fs.exists(path):
        return False
    store.fs.rm(path, recursive=True)
    return True


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---- listing -------------------------------------------------------------------------------------------------------
RootKind = Literal["absent", "file", "directory"]


def root_kind(store: ArtifactStore) -> RootKind:
    """Whether the root exists and is a directory (an object-store prefix with objects under it counts as one)."""
    try:
        if store.fs.isfile(store.base):
            return "file"
        return "directory" if store.fs.isdir(store.base) else "absent"
    except OSError as err:
        raise InputError(f"cannot read the artifact root {store.root} ({err.__class__.__name__}: {err})") from None


def check_root(store: ArtifactStore) -> bool:
    """True if the root exists, False if not; a root that is a file is the user's error (one line)."""
    kind = root_kind(store)
    if kind == "file":
        raise InputError(f"artifact root {store.root} is a file, not a directory; pass the directory that holds "
                         f"the artifacts with --artifacts or ARTIFACTS")
    return kind == "directory"


@dataclass(frozen=True)
class Build:
    """One ``<root>/<stage>/<key>/`` directory: its manifest if valid, else why not."""

    stage: str
    key: str
    manifest: Manifest | None
    problem: str = ""             # the ArtifactError's message when ``manifest`` is None
    last_used: str | None = None


def _entries(store: ArtifactStore, stage: str) -> list[str]:
    """Names of the directories directly under ``<root>/<stage>``."""
    path = "/".join([store.base, stage])
    try:
        listing = store.fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    except OSError as err:
        raise InputError(f"cannot list {store.url(stage)} ({err.__class__.__name__}: {err})") from None
    names = {str(info["name"]).rstrip("/").rsplit("/", 1)[-1] for info in listing if info.get("type") == "directory"}
    return sorted(names)


def builds(store: ArtifactStore, stage: str) -> list[Build]:
    """Every build directory of ``stage``, oldest first (invalid ones last), each validated as a run would."""
    found = []
    for name in _entries(store, stage):
        if name.startswith("."):
            continue
        if not has_manifest(store, stage, name):   # an object store's build being written (or killed)
            found.append(Build(stage, name, None, problem="no manifest: being written, or left by a killed run"))
            continue
        try:
            found.append(Build(stage, name, store.load(stage, name), last_used=last_used(store, stage, name)))
        except ArtifactError as err:
            found.append(Build(stage, name, None, problem=str(err)))
    return sorted(found, key=lambda b: (b.manifest is None, b.manifest.created if b.manifest else "", b.key))


def unfinished(store: ArtifactStore, stage: str) -> list[str]:
    """The work directories of builds being written now, or left by a killed run (local roots only)."""
    return [name for name in _entries(store, stage) if name.startswith(TMP_PREFIX)]


def has_manifest(store: ArtifactStore, stage: str, key: str) -> bool:
    """Whether ``stage/key`` has a manifest at all (valid or not): absent means "not built"."""
    return bool(store.fs.exists("/".join([store.base, stage, key, MANIFEST])))


def size_of(store: ArtifactStore, *parts: str) -> int:
    """Bytes under ``<root>/<parts>`` (0 if absent)."""
    path = "/".join([store.base, *parts])
    try:
        return int(store.fs.du(path, total=True)) if store.fs.exists(path) else 0
    except OSError:
        return 0
