"""Where a running build writes (``StageWriter``) and the picklable address of its work directory that units in
other processes write through (``WorkDir``); ``ArtifactStore.writing`` makes the writer and publishes what it wrote."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from storage.checksums import digests
from storage.manifest import MANIFEST, Manifest, builds_behind, library_versions

if TYPE_CHECKING:
    from storage.store import ArtifactStore


@dataclass(frozen=True)
class WorkDir:
    """A build's work directory by URL (``StageWriter.work_dir``): ``file_url`` as the writer's, nothing else."""

    url: str
    local: bool = True   # the URL is a local path (a file-system root, shared on a cluster)
    stage: str = ""
    key: str = ""

    def file_url(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def scratch(self) -> contextlib.AbstractContextManager[str]:
        """A unit's own spill directory, as ``StageWriter.scratch`` (beside the work directory on a local root,
        else in the unit's ``$TMPDIR``): a unit on another worker spills where it runs, never into another's."""
        return _scratch(self.url if self.local else None, self.stage, self.key)


@contextmanager
def _scratch(work: str | None, stage: str, key: str) -> Iterator[str]:
    """A fresh directory beside ``work`` (a local work directory), or in ``$TMPDIR`` when ``work`` is None;
    removed when the block ends, whatever happens."""
    if work is not None:
        path = f"{work}-scratch-{uuid.uuid4().hex[:6]}"
        os.makedirs(path)
    else:
        import tempfile

        path = tempfile.mkdtemp(prefix=f"gnnpipe-{stage}-{key}-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class StageWriter:
    """Where a running stage writes: ``url`` and ``file_url(rel)`` (fsspec/Zarr URLs, local paths on a local
    store), ``write_json``/``write_bytes`` for small files, plus its ``summary``. ``manifest`` is set once the
    artifact is published. The format modules (``storage.graph``, ``storage.partition``, ...) write through it."""

    def __init__(self, store: ArtifactStore, stage: str, key: str, work: str, *, version: int,
                 params: Mapping[str, Any], upstream: Mapping[str, Manifest]):
        self.store, self.stage, self.key, self._work = store, stage, key, work
        self.version, self.params, self.upstream = version, dict(params), dict(upstream)
        self.summary: dict[str, Any] = {}
        # the stage sets False when a rebuild of this key may differ (Manifest.reproducible)
        self.reproducible = True
        self.manifest: Manifest | None = None

    @property
    def url(self) -> str:
        return self._work if self.store.is_local else f"{self.store.fs.unstrip_protocol(self._work)}"

    def file_url(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def work_dir(self) -> WorkDir:
        """Where this build's files go, as a small picklable address: what a stage hands the units that write
        its files in other processes (``stages.executor``); the manifest stays this writer's to write."""
        return WorkDir(self.url, self.store.is_local, self.stage, self.key)

    def scratch(self) -> contextlib.AbstractContextManager[str]:
        """A private local directory for spill files (external sort runs, memory-mapped copies of Zarr arrays),
        removed when the block ends, whatever happens. On a local root it sits beside the work directory, on the
        artifact root's disk (``<root>/<stage>/.tmp-<key>-<id>-scratch``: a kill leaves it where ``gnnpipe
        clean`` and the next build of the key remove ``.tmp-<key>-*``); on an object store in ``$TMPDIR``."""
        return _scratch(self._work if self.store.is_local else None, self.stage, self.key)

    def write_json(self, rel: str, obj: Any) -> None:
        with self.store.fs.open(f"{self._work}/{rel}", "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)

    def write_bytes(self, rel: str, data: bytes) -> None:
        self.store.fs.pipe_file(f"{self._work}/{rel}", data)

    def _finish(self) -> None:
        files = {p[len(self._work) + 1:]: int(info["size"])
                 for p, info in self.store.fs.find(self._work, detail=True).items() if info.get("type") == "file"}
        data = {
            "stage": self.stage,
            "version": self.version,
            "key": self.key,
            "params": self.params,
            "upstream": {name: m.key for name, m in sorted(self.upstream.items())},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "files": dict(sorted(files.items())),
            "bytes": sum(files.values()),
            "summary": self.summary,
            "libraries": library_versions(),
            "uri": self.store.url(self.stage, self.key),
            "build_id": uuid.uuid4().hex,
            "reproducible": self.reproducible,
            "upstream_builds": builds_behind(self.upstream),
            "origin": os.environ.get("GNNPIPE_ORIGIN", ""),   # who built it: storage.inventory.current_origin
            # re-read once here (from the page cache: the build just wrote them) so `gnnpipe verify` can tell a
            # flipped byte from an intact file; Zarr chunks, the bulk of the bytes, are skipped (own crc32c)
            "digests": digests(self.store.fs, self._work, files),
        }
        # What is written is exactly what load() parses back: a manifest the model rejects fails the build here.
        text = json.dumps(data, indent=2, sort_keys=True, default=str)
        Manifest.model_validate(json.loads(text))
        with self.store.fs.open(f"{self._work}/{MANIFEST}", "w") as f:
            f.write(text)
