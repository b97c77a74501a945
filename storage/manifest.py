"""A stage's manifest and its content address: what ``storage.store`` writes last into every artifact, and the key
it lives under (docs/design.md §3)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from storage.errors import ArtifactError

MANIFEST = "manifest.json"
_LIBRARIES = ("torch", "numpy", "zarr", "pymetis", "prefect", "torch_geometric", "gnnpipe")


class Manifest(BaseModel):
    """A stage's manifest, ``<root>/<stage>/<key>/manifest.json``: what was built, from what, and which files.

    Unknown fields are ignored (a manifest written by a newer gnnpipe still loads, and is never taken for a
    corrupted one and rebuilt over); every field below is required but ``origin``, ``digests``, ``reproducible``
    and ``upstream_builds``, which manifests written before they existed lack. None enters the key
    (``stage_key``): adding them rebuilt nothing.
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
    # False: a rebuild of this key may differ (KaMinPar on several threads, training on a GPU), so what was built on
    # this build must not be taken for what a rebuild would give (``upstream_builds``, ``made_from``)
    reproducible: bool = True
    # the builds that are not reproducible among this one's ancestors, every generation: stage -> build_id
    upstream_builds: dict[str, str] = Field(default_factory=dict)

    def made_from(self, upstream: Mapping[str, Manifest]) -> bool:
        """Whether this build rests on exactly these upstream builds wherever a rebuild could differ: False after
        an upstream stage that is not reproducible was rebuilt (forced, or its build deleted) under the same key.
        A reproducible rebuild (``--force`` after ``gnnpipe verify`` found damage) changes nothing here."""
        return self.upstream_builds == builds_behind(upstream)


def provenance(manifest: Manifest) -> dict[str, str]:
    """The builds that are not reproducible among ``manifest``'s ancestors and itself: what a build made from it
    rests on through it."""
    return {**manifest.upstream_builds, **({} if manifest.reproducible else {manifest.stage: manifest.build_id})}


def merge_builds(parts: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """One ``upstream_builds`` from several upstreams' ``provenance``. Two that rest on different builds of one
    stage (features made from an older partition build than the one given beside them) are refused: whatever is
    built on both would mix them."""
    out: dict[str, str] = {}
    for part in parts:
        for stage, build in part.items():
            if out.setdefault(stage, build) != build:
                raise ArtifactError(f"the upstream artifacts rest on two builds of {stage} (build ids "
                                    f"{out[stage][:8]} and {build[:8]}): a {stage} build that is not reproducible "
                                    f"was rebuilt after some of them were made; rerun the pipeline, which rebuilds "
                                    f"what rests on the old one")
    return dict(sorted(out.items()))


def builds_behind(upstream: Mapping[str, Manifest]) -> dict[str, str]:
    """What a build made from ``upstream`` records as its ``upstream_builds``."""
    return merge_builds(provenance(m) for m in upstream.values())


def changed_builds(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """The stages whose non-reproducible build differs between what a build recorded (``upstream_builds``) and
    what it is checked against: what a stale build's message names."""
    return sorted(stage for stage in {*recorded, *current} if recorded.get(stage) != current.get(stage))


def builds_apart(manifest: Manifest, upstream: Manifest) -> list[str]:
    """The stages whose non-reproducible build behind ``upstream`` (itself included) is not the one ``manifest``
    was made from; empty when it was made from this very build (an infer build and the train build whose decoder
    scores its embeddings)."""
    made_from = manifest.upstream_builds
    return sorted(stage for stage, build in provenance(upstream).items() if made_from.get(stage) != build)


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


def build_key(stage: str, version: int, params: Mapping[str, Any], upstream: Mapping[str, Manifest]) -> str:
    """``stage_key`` of a build made from the ``upstream`` manifests (by stage name)."""
    return stage_key(stage, version, params, {name: m.key for name, m in upstream.items()})


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for lib in _LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions
