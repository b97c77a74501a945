"""Real data: CiteSeer (Planetoid split: 120 train, 500 valid, 1 000 test nodes, 6 classes) with the published GCN
recipe through the real stages, on 1 and 2 partitions, reaches the paper's test accuracy (Kipf & Welling 2017:
70.3 %); and the features stage's row normalisation that recipe needs (``features.normalize=l1``).

The data is not part of the project: it is read from ``../shared/data/citeseer`` (the ``files`` layout) and the
CiteSeer tests skip, saying why, where it is absent (a user's clone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.features.normalize import normalize_rows
from storage.features import FeaturesArtifact
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact
from storage.train_summary import TrainSummary
from tests._citeseer_recipe import CITESEER, PUBLISHED_GCN, citeseer_config
from tests._train_pipeline import build_without_prefect

# PyG's full-batch GCN with this recipe: 69.4-71.6 % over 5 seeds (mean 70.9 %, benchmarks/RESULTS.md); 69 % keeps
# the paper's figure within a point while a lost ingredient fails (raw features: 67.6 % mean, 68.6 % here with seed 0)
MIN_TEST_ACC = 0.69


def _need_citeseer() -> None:
    if not (CITESEER / "x.npy").exists():
        pytest.skip(f"CiteSeer not found: {CITESEER} (../shared/data is absent in a user's clone)")


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("citeseer")   # one root: both partition counts share the download


@pytest.mark.slow
@pytest.mark.parametrize("num_partitions", [1, 2])
def test_gcn_reaches_the_published_accuracy(art: Path, num_partitions: int) -> None:
    _need_citeseer()
    _, manifests = build_without_prefect({**citeseer_config(num_partitions, art), "until": "train"})
    s = manifests["train"].summary
    assert s["world_size"] == num_partitions and s["model"]["kind"] == "gcn" and len(s["epochs"]) == 200
    t = TrainSummary.from_json(s)
    assert t.test_metric is not None and t.best_val_metric is not None and t.test_metric_last is not None, s
    assert t.test_metric >= MIN_TEST_ACC, (
        f"GCN on CiteSeer, {num_partitions} partition(s): test accuracy {t.test_metric:.3f} at the best validation "
        f"epoch {t.best_epoch + 1} (val {t.best_val_metric:.3f}; last epoch {t.test_metric_last:.3f}); the paper "
        f"reports {PUBLISHED_GCN}")


def test_l1_rows() -> None:
    rows = np.array([[1, 0, 3], [0, 0, 0], [-2, 2, 0]], dtype=np.int8)
    out = normalize_rows(rows, "l1")
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.array([[0.25, 0, 0.75], [0, 0, 0], [-0.5, 0.5, 0]]))
    assert normalize_rows(rows, "none") is rows


def _bool_files_dataset(directory: Path) -> str:
    """A small graph in the ``files`` layout with 0/1 word features (bool), as CiteSeer's; some rows are all zero."""
    from stages.download.synthetic import generate_synthetic

    g = generate_synthetic(600, avg_degree=6.0, num_features=8, num_classes=3, seed=2)
    directory.mkdir()
    assert g.x is not None
    arrays = {"indptr": g.indptr, "indices": g.indices, "x": g.x > 0.5, "y": g.y,
              **{f"{split}_idx": ids for split, ids in g.splits.items()}}
    for name, arr in arrays.items():
        np.save(directory / f"{name}.npy", arr)
    return str(directory)


@pytest.mark.parametrize("source", ["bool", "float32"])
def test_features_stage_stores_l1_rows(tmp_path: Path, source: str) -> None:
    """``normalize=l1`` stores each row divided by its L1 norm (zero rows zero), as float32 under ``dtype=auto``
    also for bool x, in every partition."""
    if source == "bool":
        dataset: dict[str, Any] = {"dataset": "files", "path": _bool_files_dataset(tmp_path / "words")}
    else:   # the synthetic graph's Gaussian features: negative values too
        dataset = {"dataset": "synthetic", "num_nodes": 600, "avg_degree": 6.0, "num_features": 8,
                   "num_classes": 3, "seed": 2}
    store, manifests = build_without_prefect({**dataset, "artifacts": str(tmp_path / "art"), "num_partitions": 2,
                                              "until": "features", "normalize": "l1"})
    x = np.asarray(GraphArtifact(store, manifests["download"]).read().x)
    assert x.dtype == np.dtype(source)
    feats = FeaturesArtifact(store, manifests["features"])
    book = PartitionArtifact(store, manifests["partition"]).book()
    assert feats.feature_dtype == np.float32 and manifests["features"].summary["normalize"] == "l1"
    zero_rows = 0
    for p in range(2):
        x_p = x[book.orig_of_gid[book.bounds[p]:book.bounds[p + 1]]].astype(np.float64)
        norm = np.abs(x_p).sum(axis=1, keepdims=True)
        zero_rows += int((norm == 0).sum())
        np.testing.assert_allclose(np.asarray(feats.x(p)[:]), x_p / np.where(norm == 0, 1, norm), rtol=1e-6,
                                   atol=1e-7)
    assert (zero_rows > 0) == (source == "bool")   # the bool graph exercises the zero rows
