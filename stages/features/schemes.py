"""The features stage's coding of ``x``: which scheme a ``dtype`` choice stores, fitted over a node type's whole x,
and each partition's rows coded with it (the codec itself is ``stages.runtime.feature_codec``).

``auto``, ``float32`` and ``float16`` keep the cast of ``stages.features.dtypes`` byte for byte (scheme ``cast``).
``bfloat16`` is a cast as well (round to nearest even: 8 exponent bits as float32, so float32's range, and 8
significant bits); ``int8`` and ``float8_e4m3`` quantise each column with a scale (and an offset) fitted over every
row of the type, from every partition, so that a row decodes the same wherever it lives. The fit reads x in row
blocks (``FIT_BLOCK_ROWS`` in memory; the features stage's streamed chunks from Zarr), normalised as the stored rows
are: per-column min and max are exact over any blocks, so it never holds a second whole copy of x, nor x itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from stages.choices import FeatureDtype, FeatureNorm
from stages.download.canonical import first_non_finite
from stages.features.dtypes import storage_dtype, to_storage
from stages.features.normalize import normalize_rows, normalized_dtype
from stages.runtime.feature_codec import (
    E4M3_MAX,
    INT8_CODE_MAX,
    QUANTISED_STORAGE,
    FeatureCodec,
    numpy_dtype_of,
    numpy_view,
    torch_dtype_of,
)
from storage.errors import InputError

FIT_BLOCK_ROWS = 1 << 16
# the choices that are not a numpy dtype: (scheme, storage dtype) each stores; the quantising ones are named as their
# scheme (FeatureCodec's QUANTISED_STORAGE)
QUANTISED: dict[str, tuple[str, torch.dtype]] = {
    "bfloat16": ("cast", torch.bfloat16), **{scheme: (scheme, dtype) for scheme, dtype in QUANTISED_STORAGE.items()}}


def column_ranges(blocks: Iterable[np.ndarray], num_columns: int, normalize: FeatureNorm
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per column (min, max) of the rows of ``blocks`` (consecutive row blocks of one x, in any number and size)
    as stored (normalised), float64 [F] each; zeros for no rows. Exact whatever the blocks: a row is normalised on
    its own, and min and max of the blocks' minima and maxima are the min and max of all rows (no rounding)."""
    lo = np.full(num_columns, np.inf)
    hi = np.full(num_columns, -np.inf)
    seen = False
    for rows in blocks:
        if rows.shape[0] == 0:
            continue
        seen = True
        block = normalize_rows(rows, normalize)
        np.minimum(lo, block.min(axis=0), out=lo)
        np.maximum(hi, block.max(axis=0), out=hi)
    if not seen:
        lo[:], hi[:] = 0.0, 0.0
    return lo, hi


def row_blocks(x: np.ndarray, rows: int = FIT_BLOCK_ROWS) -> Iterator[np.ndarray]:
    """``x`` in blocks of ``rows`` rows (views)."""
    return (x[start:start + rows] for start in range(0, x.shape[0], rows))


def storage_of(source: np.dtype, requested: FeatureDtype, normalize: FeatureNorm) -> torch.dtype:
    """The storage dtype a type's x of dtype ``source`` is stored in (known before any row is read)."""
    if requested in QUANTISED:
        return QUANTISED[requested][1]
    return torch_dtype_of(storage_dtype(normalized_dtype(source, normalize), requested))


def fit_codec(x: np.ndarray, requested: FeatureDtype, normalize: FeatureNorm) -> FeatureCodec:
    """The codec a type's whole ``x`` [N, F] in memory is stored with (module docstring)."""
    return fit_codec_blocks(x.dtype, x.shape[1], row_blocks(x), requested, normalize)


def fit_codec_blocks(source: np.dtype, num_columns: int, blocks: Iterable[np.ndarray], requested: FeatureDtype,
                     normalize: FeatureNorm) -> FeatureCodec:
    """``fit_codec`` over an x of dtype ``source`` read as consecutive row ``blocks`` (a lazy iterable: a cast
    never reads it), with the same scales and offsets bit for bit (``column_ranges``)."""
    if requested not in QUANTISED:
        return FeatureCodec.cast(storage_of(source, requested, normalize))
    scheme, storage = QUANTISED[requested]
    if scheme == "cast":
        return FeatureCodec.cast(storage)
    lo, hi = column_ranges(blocks, num_columns, normalize)
    with np.errstate(over="ignore"):   # a float64 value beyond float32's range is refused by encode_rows, by row
        if scheme == "int8":
            return _int8_codec(lo, hi, integral=normalized_dtype(source, normalize).kind in "biu")
        scale = np.maximum(np.abs(lo), np.abs(hi)) / E4M3_MAX
        return FeatureCodec("float8_e4m3", storage, scale=_as_scale(scale))


def _int8_codec(lo: np.ndarray, hi: np.ndarray, integral: bool) -> FeatureCodec:
    """offset = (max + min) / 2, scale = (max - min) / 254; an integer column spanning at most 254 keeps step 1
    (exact), with an integer offset so that every value is an integer code."""
    span = hi - lo
    exact = integral & (span <= 2 * INT8_CODE_MAX)
    scale = np.where(exact, 1.0, span / (2 * INT8_CODE_MAX))
    offset = np.where(exact, np.floor((hi + lo) / 2), (hi + lo) / 2)
    return FeatureCodec("int8", torch.int8, scale=_as_scale(scale), offset=torch.from_numpy(offset.astype(np.float32)))


def _as_scale(scale: np.ndarray) -> torch.Tensor:
    """float32 scales; a zero one (a constant column, or all zeros) becomes 1: its codes are then exact."""
    out = scale.astype(np.float32)
    out[out == 0] = 1.0
    return torch.from_numpy(out)


def encode_rows(rows: np.ndarray, codec: FeatureCodec, orig_id: np.ndarray) -> np.ndarray:
    """A partition's rows of a type (orig ids ``orig_id``, already normalised) as the codes Zarr stores; a value
    beyond the storage dtype's range is refused in one line naming its node and column (``to_storage``)."""
    if codec.scheme == "cast" and codec.storage != torch.bfloat16:
        return to_storage(rows, numpy_dtype_of(codec.storage), orig_id)
    x32 = to_storage(rows, np.dtype(np.float32), orig_id)   # float64 beyond float32's range is refused here
    codes = codec.encode(torch.from_numpy(x32))
    if codes.dtype == torch.bfloat16:   # bfloat16's largest value is 3.39e38, float32's 3.40e38
        found = first_non_finite(codes.to(torch.float32).numpy())
        if found is not None:
            row, col = found
            raise InputError(f"x has {x32[row, col].item()} at row {int(orig_id[row])}, column {col}, beyond the "
                             f"range of bfloat16 (|x| <= {torch.finfo(torch.bfloat16).max:g}); set "
                             "features.dtype=float32")
    return numpy_view(codes)
