"""The features artifact format: one Zarr v3 store per partition, ``part-<p>.zarr``.

ID space: rows are **lids** of partition p (row i is gid ``start_gid + i``).

- ``x`` [n_p, F] (the dataset's dtype), row-chunked, crc32c-checked; ``y`` int64 [n_p] (-1 = unlabelled).
- ``split/train``, ``split/valid``, ``split/test``: sorted int64 lids of p's nodes in each split.
- attrs: part, start_gid, num_nodes, num_features, num_classes, chunk_rows, compressor.

A partition's store is self-contained, so a training node fetches only its own partition's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.errors import ArtifactError
from storage.graph import SPLITS
from storage.zarr_io import open_group, read_array, write_array


def part_store(p: int) -> str:
    return f"part-{p}.zarr"


@dataclass
class PartFeatures:
    part: int
    start_gid: int
    x: np.ndarray                   # [n_p, F], row = lid
    y: np.ndarray                   # [n_p]
    split_lids: dict[str, np.ndarray]
    attrs: dict[str, Any]


def write_part_features(url: str, *, part: int, start_gid: int, x: np.ndarray, y: np.ndarray,
                        split_lids: dict[str, np.ndarray], num_classes: int, chunk_rows: int,
                        compressor: str | None = None, progress: bool = False) -> dict[str, Any]:
    g = open_group(url, mode="w")
    write_array(g, "x", x, chunk_rows=chunk_rows, compressor=compressor, progress=progress)
    write_array(g, "y", y.astype(np.int64, copy=False), chunk_rows=max(chunk_rows, 1 << 20))
    split = g.create_group("split")
    for name in SPLITS:
        write_array(split, name, np.sort(split_lids[name]).astype(np.int64, copy=False), chunk_rows=1 << 20)
    attrs = {"part": part, "start_gid": start_gid, "num_nodes": int(x.shape[0]), "num_features": int(x.shape[1]),
             "feature_dtype": str(x.dtype), "num_classes": int(num_classes), "chunk_rows": int(chunk_rows),
             "compressor": compressor or "none",
             "split_sizes": {name: int(split_lids[name].shape[0]) for name in SPLITS}}
    g.attrs.update(attrs)
    return attrs


def read_part_features(url: str, *, load_x: bool = True) -> PartFeatures:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe feature store (no attrs); rerun the features stage")
    return PartFeatures(
        part=int(attrs["part"]),
        start_gid=int(attrs["start_gid"]),
        x=read_array(g, "x") if load_x else np.empty((0, attrs["num_features"])),
        y=read_array(g, "y"),
        split_lids={name: read_array(g["split"], name) for name in SPLITS},
        attrs=attrs,
    )


def open_part_x(url: str) -> Any:
    """The lazily-read ``x`` array (zarr.Array) of one partition, for partitions larger than RAM."""
    return open_group(url)["x"]
