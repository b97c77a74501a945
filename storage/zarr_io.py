"""Zarr v3 helpers: every array carries a crc32c codec so a corrupted chunk fails loudly on read.

Row-chunked, uncompressed by default: dense float features compress only ~1.1x and decompression would halve
whole-array load speed (figures in benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.codecs
from storage.progress import progress as tqdm

from storage.errors import ArtifactError

DEFAULT_CHUNK_BYTES = 64 << 20  # ~64 MiB chunks: large sequential reads, few files
MIN_CHUNK_ROWS = 8192


def _store(url: str) -> Any:
    """Local paths go to zarr's LocalStore (creates directories); URLs to the fsspec store."""
    if "://" in url and not url.startswith("file://"):
        return zarr.storage.FsspecStore.from_url(url, read_only=False)
    return url.removeprefix("file://")


def open_group(url: str, mode: str = "r") -> zarr.Group:
    try:
        return zarr.open_group(_store(url), mode=mode, zarr_format=3)
    except FileNotFoundError:
        raise ArtifactError(f"Zarr group {url} not found; rerun the stage that writes it") from None


def chunk_rows_for(shape: tuple[int, ...], itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Rows per chunk so that a chunk is about ``chunk_bytes`` (at least MIN_CHUNK_ROWS, at most all rows)."""
    row_bytes = itemsize * int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else itemsize
    rows = max(MIN_CHUNK_ROWS, chunk_bytes // max(row_bytes, 1))
    return int(max(1, min(rows, shape[0] if shape[0] else 1)))


def write_array(group: zarr.Group, name: str, data: np.ndarray, *, chunk_rows: int | None = None,
                compressor: str | None = None, attrs: Mapping[str, Any] | None = None,
                progress: bool = False) -> zarr.Array:
    """Write ``data`` as a row-chunked array with a crc32c integrity codec (and optional lz4/zstd)."""
    data = np.ascontiguousarray(data)
    rows = chunk_rows or chunk_rows_for(data.shape, data.dtype.itemsize)
    rows = max(1, min(rows, data.shape[0] or 1))
    codecs: list[Any] = []
    if compressor:
        codecs.append(zarr.codecs.BloscCodec(cname=compressor, clevel=3, shuffle="shuffle"))
    codecs.append(zarr.codecs.Crc32cCodec())
    arr = group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=(rows, *data.shape[1:]),
                             compressors=codecs, fill_value=0, overwrite=True)
    if attrs:
        arr.attrs.update(dict(attrs))
    steps = range(0, data.shape[0], rows)
    bar = tqdm(steps, desc=f"write {name}", unit="chunk", disable=not progress or len(steps) < 4, leave=False)
    for start in bar:
        arr[start:start + rows] = data[start:start + rows]
    return arr


def read_array(group: zarr.Group, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """Read a whole array chunk by chunk (bounded temporaries) and turn codec failures into ArtifactError."""
    try:
        arr = group[name]
    except KeyError:
        raise ArtifactError(f"array '{name}' missing in {group.store}; rerun the stage that writes it") from None
    if out is None:
        out = np.empty(arr.shape, dtype=arr.dtype)
    rows = arr.chunks[0] if arr.ndim else 1
    try:
        if arr.ndim == 0:
            return np.asarray(arr[...])
        for start in range(0, arr.shape[0], rows):
            out[start:start + rows] = arr[start:start + rows]
    except ValueError as err:
        if "checksum" in str(err).lower():
            raise ArtifactError(f"corrupted chunk in {group.store}/{name} ({err}); "
                                f"rerun the stage that wrote it with --force") from None
        raise
    return out
