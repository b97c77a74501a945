"""The artifact store: content-addressed stage directories, manifests, and the on-disk formats.

Stages talk to each other only through this package, and only it knows file names and layouts: a stage reads its
upstream artifacts through the typed handles defined here (``storage.graph.GraphArtifact``,
``storage.partition.PartitionArtifact``, ``storage.features.FeaturesArtifact``, ``storage.hotness.HotnessArtifact``),
built from a :class:`~storage.manifest.Manifest`, and writes its own through a :class:`~storage.writer.StageWriter` with
the format modules' ``write_*`` functions.

- The store: ``store`` (content-addressed builds), ``writer`` (``StageWriter``: where a build writes, and its
  manifest), ``manifest`` (a build's manifest and its key),
  ``checksums`` (the files' digests a manifest records), ``verify`` (a build re-read against them), ``inventory``
  (what a root holds, who built it, when it was last used), ``leftovers`` (what attempts leave outside a build),
  ``reach`` (whether another process or host sees the root), ``report`` (what a stage shows a person),
  ``progress`` (progress bars that also reach the Prefect log).
- Errors: ``errors`` (user-facing one-line errors), ``write_errors`` (a refused write as one such line).
- Formats, one module per artifact: ``schema`` (the typed graph model), ``graph`` (``graph.zarr``), ``partition``
  and ``partition_stream`` (``book.zarr`` + ``part-<p>.zarr``, in memory or chunk by chunk), ``features``,
  ``hotness``, ``train`` (and its checkpoints), ``train_summary`` (its summary as a typed record), ``phases`` (the
  phases a training pass's time is split into, and their epoch means), ``infer`` (the ranks' outputs),
  ``infer_artifact`` (reading them), ``infer_export`` (the exports in orig-id order), ``summaries`` (the other
  stages' summaries as typed records), ``tracking`` (a build's TensorBoard event file).
- Helpers: ``zarr_io`` (Zarr v3 with crc32c on every array), ``spill`` (memory-mapped ``.npy`` copies in scratch),
  ``parallel`` (writes on a few threads, their results in order).
"""

from storage.errors import ArtifactError, GnnpipeError, InputError
from storage.store import ArtifactStore, Manifest
from storage.writer import StageWriter

__all__ = ["ArtifactError", "ArtifactStore", "GnnpipeError", "InputError", "Manifest", "StageWriter"]
