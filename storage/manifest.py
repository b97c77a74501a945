"""A stage's manifest and its content address: what ``storage.store`` writes last into every artifact, and the key
it lives under (docs/design.md §3)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MANIFEST = "manifest.json"
_LIBRARIES = ("torch", "numpy", "zarr", "pymetis", "prefect", "torch_geometric", "gnnpipe")


class Manifest(BaseModel):
    """A stage's manifest, ``<root>/<stage>/<key>/manifest.json``: what was built, from what, and which files.

    Unknown fields are ignored (a manifest written by a newer gnnpipe still loads, and is never taken for a
    corrupted one and rebuilt over); every field below is required but ``origin`` and ``digests``, which manifests
    written before they existed lack. Neither enters the key (``stage_key``): adding them rebuilt nothing.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    stage: str
    version: int
    key: str
    params: dict[str, Any]
    upstream: dict[str, str]        # upstream stage name -> its artifact key
    created: str                    # ISO 8601, UTC
    files: dict[str, int]           # path relative to the artifact directory -> size in bytes
    bytes: int                      # sum of ``files``
    summary: dict[str, Any]         # the stage's figures (what its report shows)
    libraries: dict[str, str]       # library -> version, as built
    uri: str                        # the artifact directory when it was written
    build_id: str                   # tells two builds of the same key apart (tests, audits)
    origin: str = ""                # how the run that built it was invoked (storage.inventory.current_origin)
    # path -> "crc32c:<hex>" of every file but the Zarr chunks, which carry their own (storage.checksums)
    digests: dict[str, str] = Field(default_factory=dict)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def stage_key(stage: str, version: int, params: Mapping[str, Any], upstream: Mapping[str, str]) -> str:
    """The content address of a stage's artifact: same inputs, same key, on every machine.

    ``upstream``: upstream stage name -> that artifact's key (``{n: m.key for n, m in manifests.items()}``).
    """
    payload = {
        "stage": stage,
        "version": version,
        "params": dict(params),
        "upstream": {name: key for name, key in sorted(upstream.items())},
    }
    return hashlib.sha256(_canonical(payload).encode()).hexdigest()[:16]


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for lib in _LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions
