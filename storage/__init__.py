"""The artifact store: content-addressed stage directories, manifests, and the on-disk formats.

Stages talk to each other only through this package: a stage reads its upstream artifacts with the readers
defined here (``storage.graph``, ``storage.partition``, ``storage.features``, ...) and writes its own through a
:class:`~storage.store.StageWriter`.
"""

from storage.errors import ArtifactError, GnnpipeError, InputError
from storage.store import ArtifactStore, Manifest, StageWriter

__all__ = ["ArtifactError", "ArtifactStore", "GnnpipeError", "InputError", "Manifest", "StageWriter"]
