"""The stage contract, as a type: each ``stages/<name>/stage.py`` module satisfies :class:`Stage`, and the type
checker (``make lint``) verifies it where flows/config.py registers the six modules (``STAGES``).

A stage is a module, not a class: NAME, VERSION and UPSTREAM are its identity, ``Params`` its parameters (see
``stages.params``), ``run`` builds (or finds) its one artifact from its upstream manifests, ``report`` turns the
manifest's summary into what a person reads. Loose on purpose, as torchtune's recipe protocol: a contract, not a
base class to inherit code from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from stages.params import StageParams
from storage.report import Report
from storage.store import ArtifactStore, Manifest


class Stage(Protocol):
    @property
    def NAME(self) -> str: ...  # noqa: N802 - module constants read through the protocol

    @property
    def VERSION(self) -> int: ...  # noqa: N802 - bump when what the stage computes changes (docs/design.md §3)

    @property
    def UPSTREAM(self) -> tuple[str, ...]: ...  # noqa: N802

    @property
    def Params(self) -> type[StageParams]: ...  # noqa: N802

    def run(self, store: ArtifactStore, params: Any, upstream: Mapping[str, Manifest], *, force: bool = ...,
            progress: bool = ...) -> Manifest: ...

    def report(self, manifest: Manifest) -> Report: ...
