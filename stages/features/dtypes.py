"""The features stage's storage dtype: which dtype a dataset's ``x`` is stored in, and the checked cast into it.

The model computes in float32, and rows reach it as float32 on the training device (``NodeLoader.gather_rows`` casts
once, after the exchange). Every byte of a stored row is paid three times: in host RAM, in the device cache, and on
the wire for each remote row. So ``auto`` stores the narrowest dtype that loses nothing the model would see:

- float32 stays float32; float64 becomes float32 (the model drops those digits anyway; float64 doubles every byte);
- float16 is kept (half of float32's bytes) and upcast on the device, exactly;
- bool, int8 and uint8 are kept (1 byte a value, a quarter of float32's) and cast on the device, exactly. On a
  products-scale batch (654 k rows of 100 columns from a 1.2 M-row store, 2 threads, 4 runs on the shared 2-core
  machine) gathering float32 rows took 169-212 ms, gathering uint8 rows and casting them 123-207 ms: the cast costs
  what the narrower gather saves, and the store, the cache and every remote row shrink 4x (float16: 231-317 ms,
  2x smaller; benchmarks/bench_feature_checks.py, benchmarks/RESULTS.md);
- other integers become float32: int16 cannot travel (gloo's all_to_all refuses it: "Invalid scalar type"), int32
  is as wide as float32 and int64 twice as wide; float32 holds integers exactly up to 2^24.

``float32`` and ``float16`` force that dtype: float16 halves a float32 x, and a value beyond its range (±65 504) is
refused with its node and column rather than stored as Inf. bfloat16 is not an input dtype (numpy has none:
ml_dtypes' bfloat16 is saved by ``numpy.save`` as ``<V2`` and loads back as raw bytes); ``bfloat16``, ``int8`` and
``float8_e4m3`` as storage dtypes are ``stages.features.schemes``'s (this module is what ``auto``, ``float32`` and
``float16`` store).
"""

from __future__ import annotations

import numpy as np

from stages.choices import FeatureDtype
from stages.download.canonical import first_non_finite
from storage.errors import InputError

# what ``auto`` keeps as it is (native byte order); everything else is stored as float32
AUTO_KEPT = frozenset({"float32", "float16", "bool", "int8", "uint8"})


def storage_dtype(source: np.dtype, requested: FeatureDtype) -> np.dtype:
    """The dtype a source ``x`` of dtype ``source`` is stored in, for the features stage's ``dtype`` parameter."""
    if requested != "auto":
        return np.dtype(requested)
    name = np.dtype(source).newbyteorder("=").name
    return np.dtype(name) if name in AUTO_KEPT else np.dtype(np.float32)


def to_storage(rows: np.ndarray, dtype: np.dtype, orig_id: np.ndarray) -> np.ndarray:
    """``rows`` (orig ids ``orig_id``, in row order) cast to ``dtype``; a value the cast turns into ±Inf is refused
    in one line naming its node (orig id) and column."""
    with np.errstate(over="ignore"):   # an overflow is found below, with its position
        out = rows.astype(dtype, copy=False)
    if out is rows or dtype.kind != "f":
        return out
    found = first_non_finite(out)
    if found is None:
        return out
    row, col = found
    node, value = int(orig_id[row]), rows[row, col].item()
    if isinstance(value, float) and not np.isfinite(value):   # a graph downloaded before the finite check
        raise InputError(f"x has {value} at row {node}, column {col}; features must be finite: fix the dataset "
                         "and rerun with --force download")
    raise InputError(f"x has {value} at row {node}, column {col}, beyond the range of {dtype.name} "
                     f"(|x| <= {float(np.finfo(dtype).max):g}); set features.dtype=float32")
