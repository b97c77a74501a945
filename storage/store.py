"""Content-addressed artifact store (docs/design.md).

Layout::

    <root>/<stage>/<key>/manifest.json   written last
    <root>/<stage>/<key>/...             the stage's files (Zarr groups, json, png)

``key = hash(stage, VERSION, params, upstream keys)``. A stage writes into a temporary sibling
``<root>/<stage>/.tmp-<key>-<uuid>/`` which is renamed into place once the manifest is written, so a killed
stage never leaves anything that looks valid. On object stores (no atomic rename) files go straight to the final
prefix and the manifest is published last: an artifact without a manifest does not exist.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from storage.errors import ArtifactError, InputError
from storage.manifest import MANIFEST, Manifest, build_key, builds_behind, changed_builds
from storage.write_errors import write_failure
from storage.writer import StageWriter

_log = logging.getLogger("gnnpipe.store")


class ArtifactStore:
    """Stage artifacts under one root, a local path or any fsspec URL."""

    def __init__(self, root: str | os.PathLike[str]):
        root = os.fspath(root)
        self.fs, base = fsspec.core.url_to_fs(root)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.base = base.rstrip("/")
        self.root = self.base if self.is_local else root.rstrip("/")

    # ---- addresses -------------------------------------------------------------------------------------
    def url(self, *parts: str) -> str:
        """A URL (or local path) under the root, usable with fsspec and Zarr."""
        return "/".join([self.root, *parts])

    def _path(self, *parts: str) -> str:
        """A path in ``self.fs``'s own namespace."""
        return "/".join([self.base, *parts])

    # ---- reading ---------------------------------------------------------------------------------------
    def load(self, stage: str, key: str) -> Manifest:
        """The validated manifest of ``stage/key``; raises :class:`ArtifactError` naming the bad file."""
        return self.check_files(self.read_manifest(stage, key))

    def read_manifest(self, stage: str, key: str) -> Manifest:
        """The parsed manifest of ``stage/key``, its files not checked (``storage.verify`` checks them itself);
        raises :class:`ArtifactError` if it is missing or unreadable."""
        path = self._path(stage, key, MANIFEST)
        if not self.fs.exists(path):
            raise ArtifactError(f"artifact {stage}/{key} is missing ({self.url(stage, key, MANIFEST)} not found); "
                                f"rerun the pipeline to rebuild it")
        try:
            with self.fs.open(path, "r") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ArtifactError(f"corrupted manifest {self.url(stage, key, MANIFEST)} ({err}); "
                                f"delete {self.url(stage, key)} or rerun with --force {stage}") from None
        return _parse(data, stage, key, self)

    def find(self, stage: str, key: str, upstream: Mapping[str, Manifest] | None = None) -> Manifest | None:
        """The manifest if ``stage/key`` exists and is valid, else None. Given ``upstream`` (the builds a run
        would make it from), None too when it was made from other builds of a stage that is not reproducible
        (``Manifest.made_from``): what a run would rebuild. Upstream builds that rest on two builds of one stage
        raise a one-line ArtifactError (``storage.manifest.merge_builds``)."""
        try:
            manifest = self.load(stage, key)
        except ArtifactError:
            return None
        return manifest if upstream is None or manifest.made_from(upstream) else None

    def cached(self, stage: str, version: int, params: Mapping[str, Any],
               upstream: Mapping[str, Manifest]) -> Manifest | None:
        """The build ``build`` would return for these inputs without running its body, else None: a stage asks
        before it opens an executor or plans memory that a cached build does not need."""
        return self.find(stage, build_key(stage, version, params, upstream), upstream)

    def check_files(self, manifest: Manifest) -> Manifest:
        """``manifest`` if every file it lists exists with its recorded size, else an ArtifactError naming one."""
        stage, key = manifest.stage, manifest.key
        if (problem := self.size_problem(manifest)) is None:
            return manifest
        rel, got = problem
        if got is None:
            raise ArtifactError(f"artifact {stage}/{key} is incomplete: {self.url(stage, key, rel)} is "
                                f"missing; rerun with --force {stage}")
        raise ArtifactError(f"artifact {stage}/{key} is corrupted: {self.url(stage, key, rel)} has {got} "
                            f"bytes, manifest says {manifest.files[rel]}; rerun with --force {stage}")

    def size_problem(self, manifest: Manifest) -> tuple[str, int | None] | None:
        """The first file ``manifest`` lists that is missing (None) or not of its recorded size (its size), else
        None."""
        sizes = self.file_sizes(manifest.stage, manifest.key)
        for rel, size in manifest.files.items():
            if (got := sizes.get(rel)) != size:
                return rel, got
        return None

    def file_sizes(self, stage: str, key: str) -> dict[str, int]:
        """Every file under ``<root>/<stage>/<key>/`` (relative path -> bytes), from one listing."""
        base = self._path(stage, key)
        try:
            listing = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(base) + 1:]: int(info["size"]) for p, info in listing.items() if info.get("type") == "file"}

    def manifest_digest(self, stage: str, key: str) -> str:
        """SHA-256 (16 hex digits) of the artifact's manifest file, which records its build id and every file's size:
        two builds of one key differ, a byte-for-byte copy of a build does not."""
        return hashlib.sha256(self.read_bytes(stage, key, MANIFEST)).hexdigest()[:16]

    def read_bytes(self, stage: str, key: str, rel: str) -> bytes:
        """A small file of an artifact (a PNG, a json report)."""
        try:
            return self.fs.cat_file(self._path(stage, key, rel))
        except FileNotFoundError:
            raise ArtifactError(f"{self.url(stage, key, rel)} not found; rerun with --force {stage}") from None

    # ---- writing ---------------------------------------------------------------------------------------
    def check_writable(self, stage: str | None = None) -> None:
        """Fail early, with a clear message, if the root cannot be written (``stage``: the stage about to write,
        named in the message when the file system refuses, e.g. a full disk)."""
        probe = self._path(f".probe-{uuid.uuid4().hex}")
        try:
            self.fs.makedirs(self.base, exist_ok=True)
            self.fs.pipe_file(probe, b"ok")
            self.fs.rm_file(probe)
        except (OSError, PermissionError) as err:
            self._remove_quietly(probe)
            if stage is not None and (failure := write_failure(err, stage, self.root)) is not None:
                raise failure from None
            raise InputError(f"artifact root {self.root} is not writable ({err.__class__.__name__}: "
                             f"{getattr(err, 'strerror', None) or err}); pass a writable --artifacts/ARTIFACTS"
                             ) from None

    @contextmanager
    def writing(self, stage: str, key: str, *, version: int, params: Mapping[str, Any],
                upstream: Mapping[str, Manifest], replace: bool = False) -> Iterator[StageWriter]:
        """Write a stage's artifact; the manifest is written last and the directory published atomically.

        If a valid artifact appears meanwhile (a concurrent run), it is kept unless ``replace`` (a forced rerun).
        A write the file system refuses (full, over quota, read-only, ...) raises a one-line ``StoreWriteError``
        (``storage.write_errors``) naming the stage and the root; whatever the stage wrote is removed first.
        """
        self.check_writable(stage)
        final = self._path(stage, key)
        if self.is_local:
            work = self._path(stage, f".tmp-{key}-{uuid.uuid4().hex[:8]}")
        else:
            work = final
            if self.fs.exists(final):
                self.fs.rm(final, recursive=True)
        writer = StageWriter(self, stage, key, work, version=version, params=params, upstream=upstream)
        try:
            self.fs.makedirs(work, exist_ok=True)
            yield writer
            writer._finish()
            if self.is_local:
                self._publish_local(work, final, stage, key, replace, upstream)
        except BaseException as err:
            self._remove_quietly(work if self.is_local else final)
            self._prune_empty(stage)
            if (failure := write_failure(err, stage, self.root)) is not None:
                raise failure from None
            raise
        writer.manifest = self.load(stage, key)

    def _publish_local(self, work: str, final: str, stage: str, key: str, replace: bool,
                       upstream: Mapping[str, Manifest]) -> None:
        if os.path.isdir(final):
            # a concurrent run published it first, from the same upstream builds
            if not replace and self.find(stage, key, upstream) is not None:
                shutil.rmtree(work, ignore_errors=True)
                return
            # Move the old one aside first: the final name is never a half-deleted directory.
            trash = f"{work}.old"
            os.rename(final, trash)
            os.rename(work, final)
            shutil.rmtree(trash, ignore_errors=True)
            return
        os.rename(work, final)

    def _remove_quietly(self, path: str) -> None:
        """``_remove`` after a failure: a cleanup error must not hide the failure (a ``.tmp-*`` directory left
        behind is never taken for an artifact)."""
        try:
            self._remove(path)
        except OSError as err:
            _log.warning("could not remove %s after a failed write: %s", path, err)

    def _prune_empty(self, stage: str) -> None:
        """Remove ``<root>/<stage>/`` after a failed first build of the stage: an empty stage directory would make a
        root look as if it held something of that stage (``gnnpipe status``)."""
        if self.is_local:
            with contextlib.suppress(OSError):   # not empty (other builds, a concurrent run's work), or gone
                os.rmdir(self._path(stage))

    def build(self, stage: str, version: int, params: Mapping[str, Any], upstream: Mapping[str, Manifest],
              body: Callable[[StageWriter], None], *, force: bool = False) -> Manifest:
        """Return the valid artifact for these inputs, running ``body`` only when none exists (or ``force``).

        This is the idempotence that makes concurrent runs safe: the flow serialises a stage with a file lock,
        and whoever comes second finds the first one's artifact here instead of computing it again.
        """
        key = build_key(stage, version, params, upstream)
        existing = None if force else self.find(stage, key)
        if existing is not None and existing.made_from(upstream):
            return existing
        if existing is not None:   # made from another build of a non-reproducible upstream: replaced as if forced
            _log.info("%s/%s rests on another build of %s: rebuilding it", stage, key,
                      ", ".join(changed_builds(existing.upstream_builds, builds_behind(upstream))))
        with self.writing(stage, key, version=version, params=params, upstream=upstream,
                          replace=force or existing is not None) as writer:
            body(writer)
        assert writer.manifest is not None
        self._log_build(writer.manifest)
        return writer.manifest

    def _log_build(self, manifest: Manifest) -> None:
        """Append to ``<root>/builds.log``: an audit trail of what was computed, where and when."""
        if not self.is_local:
            return
        entry = {"stage": manifest.stage, "key": manifest.key, "build_id": manifest.build_id,
                 "created": manifest.created, "host": platform.node(), "pid": os.getpid(),
                 "wall_s": manifest.summary.get("wall_s")}
        try:
            with open(self._path("builds.log"), "a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError as err:   # the artifact is published and valid: a full disk costs the audit line only
            _log.warning("could not append to %s: %s", self._path("builds.log"), err)

    def builds(self) -> list[dict[str, Any]]:
        """The entries of ``builds.log`` (empty for object stores)."""
        path = self._path("builds.log")
        if not self.is_local or not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def remove(self, stage: str, key: str | None = None) -> None:
        self._remove(self._path(stage, key) if key else self._path(stage))

    def _remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)


class ArtifactHandle:
    """Base of the typed read handles (``GraphArtifact``, ``PartitionArtifact``, ...): the artifact of stage
    ``STAGE`` that ``manifest`` describes. The subclass, in the storage module of that format, is the only code that
    knows its file and array names."""

    STAGE: ClassVar[str]

    def __init__(self, store: ArtifactStore, manifest: Manifest) -> None:
        if manifest.stage != self.STAGE:
            raise ValueError(f"{type(self).__name__} reads a {self.STAGE} artifact, not {manifest.stage}/"
                             f"{manifest.key}")
        self.store, self.manifest = store, manifest

    def _url(self, rel: str) -> str:
        """A file or Zarr group of this artifact."""
        return self.store.url(self.manifest.stage, self.manifest.key, rel)


def _parse(data: Any, stage: str | None, key: str | None, store: ArtifactStore) -> Manifest:
    """``data`` (a manifest's JSON) as a :class:`Manifest`, or an ArtifactError naming the file."""
    where = store.url(stage, key, MANIFEST) if stage and key else "manifest"
    hint = f"rerun with --force {stage}" if stage else "rerun the pipeline"
    if not isinstance(data, dict):
        raise ArtifactError(f"corrupted manifest {where} (missing fields); {hint}")
    try:
        return Manifest.model_validate(data)
    except ValidationError as err:
        if any(e["type"] == "missing" for e in err.errors()):
            raise ArtifactError(f"corrupted manifest {where} (missing fields); {hint}") from None
        bad = sorted({str(e["loc"][0]) for e in err.errors() if e["loc"]})
        raise ArtifactError(f"corrupted manifest {where} (bad fields: {', '.join(bad)}); {hint}") from None
