"""The features stage's coding of ``x``: which scheme a ``dtype`` choice stores, fitted over a node type's whole x,
and each partition's rows coded with it (the codec itself is ``stages.runtime.feature_codec``).

``auto``, ``float32`` and ``float16`` keep the cast of ``stages.features.dtypes`` byte for byte (scheme ``cast``).
``bfloat16`` is a cast as well (round to nearest even: 8 exponent bits as float32, so float32's range, and 8
significant bits); ``int8`` and ``float8_e4m3`` quantise each column with a scale (and an offset) fitted over every
row of the type, from every partition, so that a row decodes the same wherever it lives. The fit reads x in blocks
of ``FIT_BLOCK_ROWS`` rows, normalised as the stored rows are, so it never holds a second whole copy of x.
"""

from __future__ import annotations

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


def column_ranges(x: np.ndarray, normalize: FeatureNorm) -> tuple[np.ndarray, np.ndarray]:
    """Per column (min, max) of ``x``'s rows as stored (normalised), float64 [F] each; zeros for no rows."""
    lo = np.full(x.shape[1], np.inf)
    hi = np.full(x.shape[1], -np.inf)
    for start in range(0, x.shape[0], FIT_BLOCK_ROWS):
        block = normalize_rows(x[start:start + FIT_BLOCK_ROWS], normalize)
        np.minimum(lo, block.min(axis=0), out=lo)
        np.maximum(hi, block.max(axis=0), out=hi)
    if x.shape[0] == 0:
        lo[:], hi[:] = 0.0, 0.0
    return lo, hi


def fit_codec(x: np.ndarray, requested: FeatureDtype, normalize: FeatureNorm) -> FeatureCodec:
    """The codec a type's whole ``x`` [N, F] is stored with (module docstring)."""
    if requested not in QUANTISED:
        stored = storage_dtype(normalized_dtype(x.dtype, normalize), requested)
        return FeatureCodec.cast(torch_dtype_of(stored))
    scheme, storage = QUANTISED[requested]
    if scheme == "cast":
        return FeatureCodec.cast(storage)
    lo, hi = column_ranges(x, normalize)
    with np.errstate(over="ignore"):   # a float64 value beyond float32's range is refused by encode_rows, by row
        if scheme == "int8":
            return _int8_codec(lo, hi, integral=normalized_dtype(x.dtype, normalize).kind in "biu")
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
