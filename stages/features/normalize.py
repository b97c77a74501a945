"""Row normalisation of ``x`` (the features stage's ``normalize``), applied once when the feature stores are written.

``l1``: each row divided by the sum of its absolute values; an all-zero row stays zero. For non-negative features
(bag-of-words counts) it is the row normalisation of Kipf & Welling's GCN preprocessing (``preprocess_features``)
and PyG's ``NormalizeFeatures``, part of the published recipes on the Planetoid citation graphs. On CiteSeer it
decides whether GCN reaches the published 70.3 %: PyG's full-batch GCN, 5 seeds, test accuracy at the best
validation epoch 67.6 % on the raw 0/1 words, 70.9 % on l1-normalised rows (benchmarks/RESULTS.md, "[2/7] CiteSeer").
"""

from __future__ import annotations

import numpy as np

from stages.choices import FeatureNorm


def normalized_dtype(source: np.dtype, kind: FeatureNorm) -> np.dtype:
    """The dtype ``normalize_rows`` returns for rows of dtype ``source``: float32 once rows are divided (quotients
    of bools or integers are not integers; the model computes in float32), else ``source``."""
    return np.dtype(source) if kind == "none" else np.dtype(np.float32)


def normalize_rows(rows: np.ndarray, kind: FeatureNorm) -> np.ndarray:
    """``rows`` [n, F] normalised as ``kind`` says (module docstring); ``none`` returns them as they are. The norms
    are summed in float64 (3 703 columns on CiteSeer, 100 on products) and the quotient is one float32 copy."""
    if kind == "none":
        return rows
    norm = np.abs(rows).sum(axis=1, dtype=np.float64, keepdims=True)
    norm[norm == 0] = 1.0   # a zero row stays zero (Kipf's preprocessing turns 1/0 into 0 likewise)
    out = rows.astype(np.float32, copy=True)
    out /= norm.astype(np.float32)
    return out
