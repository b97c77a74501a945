"""Spill files: raw ``.npy`` copies of Zarr arrays (or of arrays a stage builds) in a scratch directory
(``StageWriter.scratch``), opened memory-mapped, so that a stage reads a graph larger than its memory budget at
random through the page cache instead of holding it as anonymous memory.

Zarr chunks cannot be memory-mapped (each is a file with a checksum footer), and a random read through Zarr
decodes a whole 64 MiB chunk per access; one sequential copy to a raw file costs about a disk write of the array
(3.2 GB of int64 CSR indices at 14 M nodes), after which every access is a page-cache read.
"""

from __future__ import annotations

import os

import numpy as np
import zarr

from storage.zarr_io import read_rows

SPILL_CHUNK_BYTES = 64 << 20   # one Zarr chunk of the download stage's arrays: the copy's only anonymous memory


def spill_array(arr: zarr.Array, directory: str, name: str, *, dtype: np.dtype | None = None) -> np.ndarray:
    """``arr`` (at least 1-D) copied chunk by chunk into ``<directory>/<name>.npy`` (cast to ``dtype`` if given)
    and returned as a read-only memory map."""
    path = os.path.join(directory, f"{name}.npy")
    out_dtype = np.dtype(dtype or arr.dtype)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=out_dtype, shape=arr.shape)
    row_bytes = max(1, arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)))
    chunk = max(int(arr.chunks[0]), 1)
    rows = max(chunk, (SPILL_CHUNK_BYTES // row_bytes) // chunk * chunk)   # whole chunks: each decoded once
    for lo in range(0, arr.shape[0], rows):
        block = read_rows(arr, lo, lo + rows)
        out[lo:lo + block.shape[0]] = block
    out.flush()
    del out
    return np.load(path, mmap_mode="r")


def spill_append(path: str, data: np.ndarray) -> None:
    """Append ``data``'s raw bytes to the spill file ``path`` (created if missing): the external sort's bucket
    and output runs (``stages.external_sort``); a full disk raises the OSError the store reports."""
    with open(path, "ab") as f:
        np.ascontiguousarray(data).tofile(f)
