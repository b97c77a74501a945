"""The features artifact format: one Zarr v3 store per partition, ``part-<p>.zarr``.

ID space: ``y`` and the splits are over **lids** of partition p (row i is gid ``start_gid + i``, all node types);
``x/<node type>`` rows are **tlids**: row i of type t is gid ``type_start(p, t) + i`` (``storage.schema``), which
is the lid when the graph has one type.

- ``x/<node type>`` [n_pt, F_t] for each featured node type, in the storage dtype (float32, float16, bool, int8 or
  uint8: the features stage's ``dtype``; the trainer casts rows to float32 on its device), row-chunked,
  crc32c-checked; ``y`` int64 [n_p] (-1 = unlabelled).
- ``split/train``, ``split/valid``, ``split/test``: sorted int64 lids of p's nodes in each split.
- attrs: part, start_gid, num_nodes, num_classes, compressor, ``types``: per featured node type its rows,
  num_features, feature_dtype (the stored one) and chunk_rows.

A partition's store is self-contained, so a training node fetches only its own partition's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from storage.errors import ArtifactError
from storage.graph import SPLITS
from storage.schema import only_type
from storage.store import ArtifactHandle, StageWriter
from storage.zarr_io import BloscCname, attr_int, open_array, open_group, open_subgroup, read_array, write_array


def _part_store(p: int) -> str:
    return f"part-{p}.zarr"


@dataclass
class PartFeatures:
    part: int
    start_gid: int
    features: dict[str, np.ndarray]   # node type -> [n_pt, F_t], row = tlid ([0, F_t] when not loaded)
    y: np.ndarray                     # [n_p], row = lid
    split_lids: dict[str, np.ndarray]
    attrs: dict[str, Any]

    @property
    def x(self) -> np.ndarray:
        """The one featured node type's rows (every homogeneous graph's; there tlid = lid)."""
        return self.features[only_type(self.features, "x")]


def write_part_features(writer: StageWriter, *, part: int, start_gid: int, features: dict[str, np.ndarray],
                        y: np.ndarray, split_lids: dict[str, np.ndarray], num_classes: int,
                        chunk_rows: dict[str, int], compressor: BloscCname | None = None,
                        progress: bool = False) -> dict[str, Any]:
    """Write partition ``part``'s store ``part-<part>.zarr`` (``y`` and splits by lid, each type's rows by tlid);
    returns its attrs."""
    g = open_group(writer.file_url(_part_store(part)), mode="w")
    x_group = g.create_group("x")
    for name, x in features.items():
        write_array(x_group, name, x, chunk_rows=chunk_rows[name], compressor=compressor, progress=progress)
    write_array(g, "y", y.astype(np.int64, copy=False), chunk_rows=max([*chunk_rows.values(), 1 << 20]))
    split = g.create_group("split")
    for name in SPLITS:
        write_array(split, name, np.sort(split_lids[name]).astype(np.int64, copy=False), chunk_rows=1 << 20)
    attrs: dict[str, Any] = {
        "part": part, "start_gid": start_gid, "num_nodes": int(y.shape[0]), "num_classes": int(num_classes),
        "compressor": compressor or "none",
        "types": {name: {"rows": int(x.shape[0]), "num_features": int(x.shape[1]), "feature_dtype": str(x.dtype),
                         "chunk_rows": int(chunk_rows[name])} for name, x in features.items()},
        "split_sizes": {name: int(split_lids[name].shape[0]) for name in SPLITS}}
    g.attrs.update(attrs)
    return attrs


def _read_part_features(url: str, *, load_x: bool = True) -> PartFeatures:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe feature store (no attrs); rerun the features stage")
    types = attrs.get("types")
    if not isinstance(types, dict):
        raise ArtifactError(f"{url} has no per-type feature attrs; rerun the features stage")
    x_group = open_subgroup(g, "x")
    return PartFeatures(
        part=attr_int(attrs, "part", url),
        start_gid=attr_int(attrs, "start_gid", url),
        features={name: read_array(x_group, name) if load_x else np.empty((0, int(t["num_features"])))
                  for name, t in types.items()},
        y=read_array(g, "y"),
        split_lids={name: read_array(open_subgroup(g, "split"), name) for name in SPLITS},
        attrs=attrs,
    )


class FeaturesArtifact(ArtifactHandle):
    """The features stage's artifact, read through its manifest."""

    STAGE = "features"

    def _type_name(self, node_type: str | None, what: str) -> str:
        return node_type if node_type is not None else only_type(self.manifest.summary["types"], what)

    def _type(self, node_type: str | None) -> dict[str, Any]:
        types: dict[str, dict[str, Any]] = self.manifest.summary["types"]
        return types[self._type_name(node_type, "the feature width")]

    @property
    def featured_types(self) -> tuple[str, ...]:
        return tuple(self.manifest.summary["types"])

    def num_features_of(self, node_type: str | None = None) -> int:
        """Columns of a node type's rows (``None``: the one featured type)."""
        return int(self._type(node_type)["num_features"])

    def feature_dtype_of(self, node_type: str | None = None) -> np.dtype:
        """The stored dtype of a type's rows (``source_dtype`` in the summary is the dataset's)."""
        return np.dtype(self._type(node_type)["feature_dtype"])

    def row_bytes_of(self, node_type: str | None = None) -> int:
        """Bytes of one stored feature row (what the cache budget and the exchange pay)."""
        return self.num_features_of(node_type) * self.feature_dtype_of(node_type).itemsize

    @property
    def num_features(self) -> int:
        return self.num_features_of()

    @property
    def feature_dtype(self) -> np.dtype:
        return self.feature_dtype_of()

    @property
    def row_bytes(self) -> int:
        return self.row_bytes_of()

    @property
    def num_classes(self) -> int:
        return int(self.manifest.summary["num_classes"])

    def x(self, p: int, node_type: str | None = None) -> zarr.Array:
        """Partition p's rows of a node type (``None``: the one featured type) [n_pt, F_t] by tlid, opened lazily
        (nothing read yet): what a rank's feature store loads, or reads chunk-wise when it is over the memory
        budget (``storage.zarr_io.read_into`` reads it whole, turning a bad checksum into ArtifactError)."""
        return open_array(open_subgroup(open_group(self._url(_part_store(p))), "x"), self._type_name(node_type, "x"))

    def part(self, p: int, load_x: bool = True) -> PartFeatures:
        """Partition p's labels and split lids, and its ``x`` unless ``load_x=False`` (then an empty [0, F])."""
        return _read_part_features(self._url(_part_store(p)), load_x=load_x)
