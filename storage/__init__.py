"""The artifact store: content-addressed stage directories, manifests, and the on-disk formats.

Stages talk to each other only through this package, and only it knows file names and layouts: a stage reads its
upstream artifacts through the typed handles defined here (``storage.graph.GraphArtifact``,
``storage.partition.PartitionArtifact``, ``storage.features.FeaturesArtifact``, ``storage.hotness.HotnessArtifact``),
built from a :class:`~storage.manifest.Manifest`, and writes its own through a :class:`~storage.store.StageWriter` with
the format modules' ``write_*`` functions.
"""

from storage.errors import ArtifactError, GnnpipeError, InputError
from storage.store import ArtifactStore, Manifest, StageWriter

__all__ = ["ArtifactError", "ArtifactStore", "GnnpipeError", "InputError", "Manifest", "StageWriter"]
