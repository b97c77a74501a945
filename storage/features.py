"""The features artifact format: one Zarr v3 store per partition, ``part-<p>.zarr``.

ID space: ``y`` and the splits are over **lids** of partition p (row i is gid ``start_gid + i``, all node types);
``x/<node type>`` rows are **tlids**: row i of type t is gid ``type_start(p, t) + i`` (``storage.schema``), which
is the lid when the graph has one type.

- ``x/<node type>`` [n_pt, F_t] for each featured node type: its codes in the storage dtype (float32, float16,
  bfloat16, bool, int8, uint8 or float8_e4m3fn: the features stage's ``dtype``; the trainer decodes rows to float32
  on its device, ``stages.runtime.feature_codec``), row-chunked, crc32c-checked. bfloat16 and float8 codes are
  stored as their bits (uint16, uint8; Zarr 3 has neither type), and the array's attrs name the storage dtype and
  the scheme. ``y`` int64 [n_p] (-1 = unlabelled).
- ``scheme/<node type>/scale``, ``scheme/<node type>/offset``: float32 [F_t], where the type's scheme has them
  (``int8``: both; ``float8_e4m3``: scale), fitted over the whole x of the type, so every partition holds the same.
- ``split/train``, ``split/valid``, ``split/test``: sorted int64 lids of p's nodes in each split.
- attrs: part, start_gid, num_nodes, num_classes, compressor, ``types``: per featured node type its rows,
  num_features, feature_dtype (the storage dtype), scheme (absent in stores written before it: ``cast``) and
  chunk_rows.

A partition's store is self-contained, so a training node fetches only its own partition's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import zarr

from storage.errors import ArtifactError
from storage.graph import SPLITS
from storage.progress import progress as tqdm
from storage.schema import only_type
from storage.store import ArtifactHandle
from storage.summaries import FeaturesSummary
from storage.writer import StageWriter, WorkDir
from storage.zarr_io import (
    BloscCname,
    attr_int,
    create_rows_array,
    open_array,
    open_group,
    open_subgroup,
    read_array,
    write_array,
)


def _part_store(p: int) -> str:
    return f"part-{p}.zarr"


@dataclass(frozen=True)
class FeatureScheme:
    """How a node type's rows are coded (``stages.runtime.feature_codec``): the scheme's name (``cast``, ``int8``,
    ``float8_e4m3``), the storage dtype's name (torch's: ``bfloat16``, ``float8_e4m3fn``, ...) and its per-column
    float32 arrays."""

    name: str
    storage_dtype: str
    scale: np.ndarray | None = None
    offset: np.ndarray | None = None

    @property
    def code_dtype(self) -> np.dtype:
        """The numpy dtype the codes are stored in (the bits of bfloat16 and float8 as uint16 and uint8)."""
        return np.dtype(CODE_DTYPES.get(self.storage_dtype, self.storage_dtype))


# storage dtypes that numpy and Zarr 3 lack, and the integer dtype of the same width that holds their bits (the one
# declaration: stages.runtime.feature_codec derives its torch dtypes from it)
CODE_DTYPES = {"bfloat16": "uint16", "float8_e4m3fn": "uint8"}


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


class PartFeaturesWriter:
    """Partition ``part``'s store, written in two steps: ``open`` creates it with each type's empty ``x`` (its
    chunks, codecs and scheme arrays, as ``write_part_features`` lays them out), the caller fills ``x[name]`` in
    whole chunks (``arr[lo:hi] = codes``, a stage that streams rows from a source larger than its memory), and
    ``finish`` writes ``y``, the splits and the attrs."""

    def __init__(self, writer: StageWriter | WorkDir, *, part: int, start_gid: int, shapes: dict[str, tuple[int, int]],
                 chunk_rows: dict[str, int], schemes: dict[str, FeatureScheme],
                 compressor: BloscCname | None = None) -> None:
        self.part, self.start_gid, self.shapes, self.compressor = part, start_gid, shapes, compressor
        self.chunk_rows, self.schemes = chunk_rows, schemes
        self.group = open_group(writer.file_url(_part_store(part)), mode="w")
        x_group, scheme_group = self.group.create_group("x"), self.group.create_group("scheme")
        self.x: dict[str, zarr.Array] = {}
        for name, shape in shapes.items():
            scheme = schemes[name]
            self.x[name] = create_rows_array(x_group, name, shape, scheme.code_dtype, chunk_rows=chunk_rows[name],
                                             compressor=compressor,
                                             attrs={"scheme": scheme.name, "storage_dtype": scheme.storage_dtype})
            columns = scheme_group.create_group(name)
            for what, values in (("scale", scheme.scale), ("offset", scheme.offset)):
                if values is not None:
                    write_array(columns, what, values.astype(np.float32, copy=False))

    def finish(self, *, y: np.ndarray, split_lids: dict[str, np.ndarray], num_classes: int) -> dict[str, Any]:
        """Write ``y`` (by lid), the split lids and the attrs; returns the attrs."""
        g = self.group
        write_array(g, "y", y.astype(np.int64, copy=False), chunk_rows=max([*self.chunk_rows.values(), 1 << 20]))
        split = g.create_group("split")
        for name in SPLITS:
            write_array(split, name, np.sort(split_lids[name]).astype(np.int64, copy=False), chunk_rows=1 << 20)
        attrs: dict[str, Any] = {
            "part": self.part, "start_gid": self.start_gid, "num_nodes": int(y.shape[0]),
            "num_classes": int(num_classes), "compressor": self.compressor or "none",
            "types": {name: {"rows": int(rows), "num_features": int(cols),
                             "feature_dtype": self.schemes[name].storage_dtype, "scheme": self.schemes[name].name,
                             "chunk_rows": int(self.chunk_rows[name])} for name, (rows, cols) in self.shapes.items()},
            "split_sizes": {name: int(split_lids[name].shape[0]) for name in SPLITS}}
        g.attrs.update(attrs)
        return attrs


def write_part_features(writer: StageWriter, *, part: int, start_gid: int, features: dict[str, np.ndarray],
                        y: np.ndarray, split_lids: dict[str, np.ndarray], num_classes: int,
                        chunk_rows: dict[str, int], schemes: dict[str, FeatureScheme] | None = None,
                        compressor: BloscCname | None = None, progress: bool = False) -> dict[str, Any]:
    """Write partition ``part``'s store ``part-<part>.zarr`` (``y`` and splits by lid, each type's codes by tlid,
    coded as ``schemes`` says: by default each ``features`` array's own dtype) from rows in memory; returns its
    attrs."""
    schemes = {name: (schemes or {}).get(name) or FeatureScheme("cast", x.dtype.name) for name, x in features.items()}
    for name, x in features.items():
        if x.dtype != schemes[name].code_dtype:
            raise ValueError(f"codes of {name} are {x.dtype}, scheme {schemes[name].name} stores "
                             f"{schemes[name].code_dtype}")
    out = PartFeaturesWriter(writer, part=part, start_gid=start_gid,
                             shapes={name: (int(x.shape[0]), int(x.shape[1])) for name, x in features.items()},
                             chunk_rows=chunk_rows, schemes=schemes, compressor=compressor)
    for name, x in features.items():
        arr, rows = out.x[name], out.x[name].chunks[0]
        steps = range(0, x.shape[0], rows)
        bar = tqdm(steps, desc=f"write {name}", unit="chunk", disable=not progress or len(steps) < 4, leave=False)
        for lo in bar:
            arr[lo:lo + rows] = x[lo:lo + rows]
    return out.finish(y=y, split_lids=split_lids, num_classes=num_classes)


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

    @cached_property
    def summary(self) -> FeaturesSummary:
        return FeaturesSummary.from_json(self.manifest.summary)

    def _type_name(self, node_type: str | None, what: str) -> str:
        return node_type if node_type is not None else only_type(self.summary.types, what)

    def _type(self, node_type: str | None) -> dict[str, Any]:
        return self.summary.types[self._type_name(node_type, "the feature width")]

    @property
    def featured_types(self) -> tuple[str, ...]:
        return tuple(self.summary.types)

    def num_features_of(self, node_type: str | None = None) -> int:
        """Columns of a node type's rows (``None``: the one featured type)."""
        return int(self._type(node_type)["num_features"])

    def feature_dtype_of(self, node_type: str | None = None) -> np.dtype:
        """The numpy dtype of a type's stored codes: the storage dtype, or for bfloat16 and float8 the integer
        dtype holding their bits (``storage_dtype_of`` names the storage dtype; ``source_dtype`` in the summary is
        the dataset's)."""
        return FeatureScheme("cast", self.storage_dtype_of(node_type)).code_dtype

    def storage_dtype_of(self, node_type: str | None = None) -> str:
        """The storage dtype's name (torch's: ``float32``, ``bfloat16``, ``int8``, ``float8_e4m3fn``, ...)."""
        return str(self._type(node_type)["feature_dtype"])

    def scheme(self, p: int, node_type: str | None = None) -> FeatureScheme:
        """How partition p's rows of a type are coded, with the per-column arrays (the same in every partition)."""
        name = self._type_name(node_type, "x")
        g = open_group(self._url(_part_store(p)))
        types = g.attrs.get("types")
        attrs: dict[str, Any] = dict(types.get(name, {})) if isinstance(types, dict) else {}
        if "scheme" not in attrs:   # written before schemes: the codes are the rows, in their own dtype
            return FeatureScheme("cast", self.storage_dtype_of(node_type))
        columns = open_subgroup(open_subgroup(g, "scheme"), name)
        found = {what: read_array(columns, what) if what in columns else None for what in ("scale", "offset")}
        return FeatureScheme(str(attrs["scheme"]), str(attrs["feature_dtype"]), found["scale"], found["offset"])

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
        return int(self.summary.num_classes)

    def x(self, p: int, node_type: str | None = None) -> zarr.Array:
        """Partition p's rows of a node type (``None``: the one featured type) [n_pt, F_t] by tlid, opened lazily
        (nothing read yet): what a rank's feature store loads, or reads chunk-wise when it is over the memory
        budget (``storage.zarr_io.read_into`` reads it whole, turning a bad checksum into ArtifactError)."""
        return open_array(open_subgroup(open_group(self._url(_part_store(p))), "x"), self._type_name(node_type, "x"))

    def part(self, p: int, load_x: bool = True) -> PartFeatures:
        """Partition p's labels and split lids, and its ``x`` unless ``load_x=False`` (then an empty [0, F])."""
        return _read_part_features(self._url(_part_store(p)), load_x=load_x)
