"""Zarr v3 helpers: every array carries a crc32c codec so a corrupted chunk fails loudly on read.

Row-chunked, uncompressed by default: dense float features compress only ~1.1x and decompression would halve
whole-array load speed (figures in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import numpy as np
import zarr
import zarr.codecs

from storage.errors import ArtifactError
from storage.parallel import in_order
from storage.progress import progress as tqdm

DEFAULT_CHUNK_BYTES = 64 << 20  # ~64 MiB chunks: large sequential reads, few files
MIN_CHUNK_ROWS = 8192

# zarr's access modes (what zarr.open_group accepts)
Mode = Literal["r", "r+", "a", "w", "w-"]
# every cname Blosc accepts, so that this layer narrows nothing; stages.choices.Compressor is the subset users pick
BloscCname = Literal["lz4", "lz4hc", "blosclz", "snappy", "zlib", "zstd"]


# an artifact's address in any URL under the root: ``.../<stage>/<16 hex digit key>/...`` (storage.store's layout)
_ARTIFACT = re.compile(r"/([A-Za-z_][\w-]*)/([0-9a-f]{16})(?=/|$)")


def rerun_hint(where: object, args: str = "the run's --config/--set") -> str:
    """What to do about a damaged file at ``where`` (a URL, path or Zarr store under the artifact root): rebuild the
    artifact that holds it, the stage and command named. ``args``: which --config/--set to run it with, when the
    caller knows more than "the run's" (``gnnpipe verify`` names those that built it)."""
    found = _ARTIFACT.findall(str(where))
    if not found:
        return "rerun, with --force <stage>, the stage whose artifact holds it"
    stage = found[-1][0]
    return (f"rerun the {stage} stage to rebuild it: `gnnpipe run --force {stage}` (or `gnnpipe stage {stage}`) "
            f"with {args}")


def _store(url: str) -> Any:
    """Local paths go to zarr's LocalStore (creates directories); URLs to the fsspec store."""
    if "://" in url and not url.startswith("file://"):
        return zarr.storage.FsspecStore.from_url(url, read_only=False)
    return url.removeprefix("file://")


def open_group(url: str, mode: Mode = "r") -> zarr.Group:
    try:
        return zarr.open_group(_store(url), mode=mode, zarr_format=3)
    except FileNotFoundError:
        raise ArtifactError(f"Zarr group {url} not found; {rerun_hint(url)}") from None


def open_array_at(url: str) -> zarr.Array:
    """The array whose directory is ``url``, for reading."""
    try:
        return zarr.open_array(_store(url), mode="r", zarr_format=3)
    except FileNotFoundError:
        raise ArtifactError(f"Zarr array {url} not found; {rerun_hint(url)}") from None


def open_array(group: zarr.Group, name: str) -> zarr.Array:
    """``group[name]``, which must be an array."""
    return _child(group, name, zarr.Array, "array")


def open_subgroup(group: zarr.Group, name: str) -> zarr.Group:
    """``group[name]``, which must be a group."""
    return _child(group, name, zarr.Group, "group")


_Node = TypeVar("_Node", zarr.Array, zarr.Group)


def _child(group: zarr.Group, name: str, kind: type[_Node], what: str) -> _Node:
    # indexing a group gives an array or a group: a damaged artifact may hold the other one
    try:
        node = group[name]
    except KeyError:
        raise ArtifactError(f"{what} '{name}' missing in {group.store}; {rerun_hint(group.store)}") from None
    if not isinstance(node, kind):
        raise ArtifactError(f"'{name}' in {group.store} is not a Zarr {what}; {rerun_hint(group.store)}")
    return node


def attr_int(attrs: Mapping[str, object], name: str, where: str) -> int:
    """Integer attr ``name`` of the Zarr group ``where`` (its url, for the message); Zarr types attrs as any JSON."""
    value = _attr(attrs, name, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArtifactError(f"attr '{name}' of {where} is {value!r}, not an integer; {rerun_hint(where)}")
    return value


def attr_str(attrs: Mapping[str, object], name: str, where: str, default: str | None = None) -> str:
    """String attr ``name`` of the Zarr group ``where``; ``default`` (if given) when the attr is absent."""
    if default is not None and name not in attrs:
        return default
    value = _attr(attrs, name, where)
    if not isinstance(value, str):
        raise ArtifactError(f"attr '{name}' of {where} is {value!r}, not a string; {rerun_hint(where)}")
    return value


def _attr(attrs: Mapping[str, object], name: str, where: str) -> object:
    try:
        return attrs[name]
    except KeyError:
        raise ArtifactError(f"attr '{name}' missing in {where}; {rerun_hint(where)}") from None


def chunk_rows_for(num_rows: int, row_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, *,
                   max_rows: int | None = None, even: bool = False) -> int:
    """Rows per chunk so that a chunk holds about ``chunk_bytes``: at least MIN_CHUNK_ROWS, at most ``max_rows``
    and at most all rows.

    ``even``: spread the rows evenly over the chunks, so that the last chunk is not mostly padding (Zarr stores
    edge chunks at full size).
    """
    rows = max(MIN_CHUNK_ROWS, chunk_bytes // max(row_bytes, 1))
    if max_rows is not None:
        rows = min(rows, max_rows)
    if even:
        num_chunks = max(1, -(-num_rows // rows))
        return int(max(1, -(-num_rows // num_chunks)))
    return int(max(1, min(rows, num_rows or 1)))


def create_rows_array(group: zarr.Group, name: str, shape: tuple[int, ...], dtype: np.dtype, *,
                      chunk_rows: int | None = None, compressor: BloscCname | None = None,
                      attrs: Mapping[str, Any] | None = None) -> zarr.Array:
    """The empty array ``write_array`` fills (same chunks, codecs and attrs), for writers that stream its rows in
    whole chunks (``arr[lo:hi] = rows``)."""
    row_bytes = np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64))
    rows = chunk_rows or chunk_rows_for(shape[0], row_bytes)
    rows = max(1, min(rows, shape[0] or 1))
    return _create_array(group, name, shape, dtype, (rows, *shape[1:]), compressor, attrs)


def _create_array(group: zarr.Group, name: str, shape: tuple[int, ...], dtype: np.dtype, chunks: tuple[int, ...],
                  compressor: BloscCname | None = None, attrs: Mapping[str, Any] | None = None) -> zarr.Array:
    """The empty array with these chunks and this module's codecs (optional Blosc, then crc32c)."""
    codecs: list[Any] = []
    if compressor:
        codecs.append(zarr.codecs.BloscCodec(cname=compressor, clevel=3, shuffle="shuffle"))
    codecs.append(zarr.codecs.Crc32cCodec())
    arr = group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, compressors=codecs, fill_value=0,
                             overwrite=True)
    if attrs:
        arr.attrs.update(dict(attrs))
    return arr


class ChunkAppender:
    """Fills a row-chunked ``array`` (``create_rows_array``) in row order from blocks of any size, making exactly
    ``write_array``'s writes: whole chunks written as they complete (a block's whole chunks straight from it, the
    rest through one chunk-sized buffer), the last one partial at ``close``. At most one chunk of rows is held."""

    def __init__(self, array: zarr.Array) -> None:
        self.array = array
        self.chunk = max(1, int(array.chunks[0]))
        self.written = 0   # rows in the array
        self.fill = 0      # rows in the buffer
        self._buffer: np.ndarray | None = None

    @property
    def count(self) -> int:
        """Rows appended so far."""
        return self.written + self.fill

    def append(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=self.array.dtype)
        while rows.shape[0]:
            if self.fill == 0 and rows.shape[0] >= self.chunk:   # whole chunks: written without a copy
                whole = rows.shape[0] - rows.shape[0] % self.chunk
                self.array[self.written:self.written + whole] = rows[:whole]
                self.written += whole
                rows = rows[whole:]
                continue
            if self._buffer is None:
                self._buffer = np.empty((self.chunk, *self.array.shape[1:]), dtype=self.array.dtype)
            take = min(self.chunk - self.fill, rows.shape[0])
            self._buffer[self.fill:self.fill + take] = rows[:take]
            self.fill += take
            rows = rows[take:]
            if self.fill == self.chunk:
                self._flush()

    def close(self) -> None:
        """Write the last, partial chunk; ValueError unless exactly the array's rows were appended."""
        self._flush()
        self._buffer = None
        if self.written != self.array.shape[0]:
            raise ValueError(f"{self.array.path}: {self.written} rows appended, {self.array.shape[0]} expected")

    def _flush(self) -> None:
        if self.fill and self._buffer is not None:
            self.array[self.written:self.written + self.fill] = self._buffer[:self.fill]
            self.written += self.fill
            self.fill = 0


def write_array(group: zarr.Group, name: str, data: np.ndarray, *, chunk_rows: int | None = None,
                compressor: BloscCname | None = None, attrs: Mapping[str, Any] | None = None,
                progress: bool = False, dtype: np.dtype | type | None = None, threads: int = 1) -> zarr.Array:
    """Write ``data`` as a row-chunked array with a crc32c integrity codec (and optional lz4/zstd), stored as
    ``dtype`` (default: ``data``'s; the caller guarantees the values fit).

    Chunk by chunk: ``data`` may be a memory map larger than memory (the download stage's streaming path), and only
    one chunk of it is made contiguous (and cast) at a time, never the whole array; ``threads`` chunks at once
    (``storage.parallel.in_order``), each a contiguous copy unless ``data``'s rows already are (an in-memory array
    of ``dtype``: the infer ranks' outputs).
    """
    data = np.asarray(data)   # a view of a memory map, never a copy
    out_dtype = np.dtype(dtype or data.dtype)
    arr = create_rows_array(group, name, data.shape, out_dtype, chunk_rows=chunk_rows, compressor=compressor,
                            attrs=attrs)
    rows = arr.chunks[0]
    steps = range(0, data.shape[0], rows)
    bar = tqdm(steps, desc=f"write {name}", unit="chunk", disable=not progress or len(steps) < 4, leave=False)

    def write_chunk(start: int) -> None:
        arr[start:start + rows] = np.ascontiguousarray(data[start:start + rows], dtype=out_dtype)

    for _ in in_order(write_chunk, bar, threads):
        pass
    return arr


def write_columns(group: zarr.Group, name: str, data: np.ndarray, *, dtype: np.dtype | type | None = None,
                  chunk_columns: int | None = None) -> zarr.Array:
    """Write a ``[K, E]`` array of a few long rows (the edge splits' (src, dst) pairs) chunked along its columns,
    about ``DEFAULT_CHUNK_BYTES`` a chunk, stored as ``dtype``: only one chunk of ``data`` (a memory map, or a
    transposed view of one) is made contiguous at a time.

    ``write_array`` cuts rows, and K = 2 rows are one chunk: the whole array held at once, 3 times over while Zarr
    encodes it (1.2 GB for 51 M int32 pairs). An array that fits one chunk (up to 8 M int32 pairs) is written by
    ``write_array``, so its bytes are what they always were; a longer one gets chunks ``(K, columns)``, which
    every reader reads alike. ``chunk_columns`` overrides the columns per chunk.
    """
    data = np.asarray(data)   # a view of a memory map, never a copy
    out_dtype = np.dtype(dtype or data.dtype)
    k, e = data.shape
    cols = chunk_columns or chunk_rows_for(e, k * out_dtype.itemsize)
    if cols >= e:
        return write_array(group, name, data, dtype=out_dtype)
    arr = _create_array(group, name, data.shape, out_dtype, (k, cols))
    for start in range(0, e, cols):
        arr[:, start:start + cols] = np.ascontiguousarray(data[:, start:start + cols], dtype=out_dtype)
    return arr


def read_array(group: zarr.Group, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """Read a whole array chunk by chunk (bounded temporaries) and turn codec failures into ArtifactError."""
    return read_into(open_array(group, name), out)


def read_ids(group: zarr.Group, name: str, native: bool = False) -> np.ndarray:
    """Node ids (int32 or int64 on disk), widened to int64 chunk by chunk (no whole stored-dtype copy beside it)
    unless ``native``, which keeps the stored dtype."""
    arr = open_array(group, name)
    return read_into(arr, None if native else np.empty(arr.shape, dtype=np.int64))


def read_into(arr: zarr.Array, out: np.ndarray | None = None) -> np.ndarray:
    """``read_array`` for an array already opened (``out``: a preallocated destination, e.g. a pinned tensor's)."""
    if arr.ndim == 0:
        return np.asarray(_checked(arr, ...))
    if out is None:
        out = np.empty(arr.shape, dtype=arr.dtype)
    rows = arr.chunks[0]
    for start in range(0, arr.shape[0], rows):
        out[start:start + rows] = read_rows(arr, start, start + rows)
    return out


def read_rows(arr: zarr.Array, lo: int, hi: int) -> np.ndarray:
    """Rows ``[lo, hi)`` of ``arr``, a codec failure turned into ArtifactError (the chunked readers' one read)."""
    return np.asarray(_checked(arr, slice(lo, hi)))


def _checked(arr: zarr.Array, where: Any) -> Any:
    try:
        return arr[where]
    except ValueError as err:
        if "checksum" in str(err).lower():
            raise ArtifactError(f"corrupted chunk in {arr.store}/{arr.path} ({err}); "
                                f"{rerun_hint(arr.store)}") from None
        raise
