"""The features artifact format: one Zarr v3 store per partition, ``part-<p>.zarr``.

ID space: rows are **lids** of partition p (row i is gid ``start_gid + i``).

- ``x`` [n_p, F] in the storage dtype (float32, float16, bool, int8 or uint8: the features stage's ``dtype``; the
  trainer casts rows to float32 on its device), row-chunked, crc32c-checked; ``y`` int64 [n_p] (-1 = unlabelled).
- ``split/train``, ``split/valid``, ``split/test``: sorted int64 lids of p's nodes in each split.
- attrs: part, start_gid, num_nodes, num_features, feature_dtype (the stored one), num_classes, chunk_rows,
  compressor.

A partition's store is self-contained, so a training node fetches only its own partition's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from storage.errors import ArtifactError
from storage.graph import SPLITS
from storage.store import ArtifactHandle, StageWriter
from storage.zarr_io import BloscCname, attr_int, open_array, open_group, open_subgroup, read_array, write_array


def _part_store(p: int) -> str:
    return f"part-{p}.zarr"


@dataclass
class PartFeatures:
    part: int
    start_gid: int
    x: np.ndarray                   # [n_p, F], row = lid
    y: np.ndarray                   # [n_p]
    split_lids: dict[str, np.ndarray]
    attrs: dict[str, Any]


def write_part_features(writer: StageWriter, *, part: int, start_gid: int, x: np.ndarray, y: np.ndarray,
                        split_lids: dict[str, np.ndarray], num_classes: int, chunk_rows: int,
                        compressor: BloscCname | None = None, progress: bool = False) -> dict[str, Any]:
    """Write partition ``part``'s store ``part-<part>.zarr`` (rows in lid order); returns its attrs."""
    g = open_group(writer.file_url(_part_store(part)), mode="w")
    write_array(g, "x", x, chunk_rows=chunk_rows, compressor=compressor, progress=progress)
    write_array(g, "y", y.astype(np.int64, copy=False), chunk_rows=max(chunk_rows, 1 << 20))
    split = g.create_group("split")
    for name in SPLITS:
        write_array(split, name, np.sort(split_lids[name]).astype(np.int64, copy=False), chunk_rows=1 << 20)
    attrs: dict[str, Any] = {
        "part": part, "start_gid": start_gid, "num_nodes": int(x.shape[0]), "num_features": int(x.shape[1]),
        "feature_dtype": str(x.dtype), "num_classes": int(num_classes), "chunk_rows": int(chunk_rows),
        "compressor": compressor or "none",
        "split_sizes": {name: int(split_lids[name].shape[0]) for name in SPLITS}}
    g.attrs.update(attrs)
    return attrs


def _read_part_features(url: str, *, load_x: bool = True) -> PartFeatures:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe feature store (no attrs); rerun the features stage")
    return PartFeatures(
        part=attr_int(attrs, "part", url),
        start_gid=attr_int(attrs, "start_gid", url),
        x=read_array(g, "x") if load_x else np.empty((0, attr_int(attrs, "num_features", url))),
        y=read_array(g, "y"),
        split_lids={name: read_array(open_subgroup(g, "split"), name) for name in SPLITS},
        attrs=attrs,
    )


class FeaturesArtifact(ArtifactHandle):
    """The features stage's artifact, read through its manifest."""

    STAGE = "features"

    @property
    def num_features(self) -> int:
        return int(self.manifest.summary["num_features"])

    @property
    def feature_dtype(self) -> np.dtype:
        """The stored dtype of ``x`` (``source_dtype`` in the summary is the dataset's)."""
        return np.dtype(self.manifest.summary["feature_dtype"])

    @property
    def num_classes(self) -> int:
        return int(self.manifest.summary["num_classes"])

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored feature row (what the cache budget and the exchange pay)."""
        return self.num_features * self.feature_dtype.itemsize

    def x(self, p: int) -> zarr.Array:
        """Partition p's ``x`` [n_p, F], rows by lid, opened lazily (nothing read yet): what a rank's feature store
        loads, or reads chunk-wise when it is over the memory budget (``storage.zarr_io.read_into`` reads it whole,
        turning a bad checksum into ArtifactError)."""
        return open_array(open_group(self._url(_part_store(p))), "x")

    def part(self, p: int, load_x: bool = True) -> PartFeatures:
        """Partition p's labels and split lids, and its ``x`` unless ``load_x=False`` (then an empty [0, F])."""
        return _read_part_features(self._url(_part_store(p)), load_x=load_x)
