"""Any numeric ``x`` trains: its stored dtype is the documented one (``stages.features.dtypes``), hotness and the
train metrics count the stored row's bytes, rows reach the model as float32; NaN/Inf, or a cast that overflows, is
refused in one line (file or dataset, row, column) and leaves no artifact behind."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.canonical import first_non_finite
from stages.download.synthetic import generate_synthetic
from stages.features.dtypes import storage_dtype
from stages.train import stage as train
from storage import ArtifactStore, InputError
from storage.features import FeaturesArtifact
from storage.graph import GraphArtifact
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from storage.train import METRICS
from storage.train_summary import TrainSummary
from tests._download_cases import write_files
from tests._train_pipeline import BATCH_SIZE, FANOUTS, build_without_prefect, train_params, train_upstream

# 3 000 nodes, 16 features, 4 classes (chance 0.25; the majority class ~0.36 on the 8 000-node graph of
# tests/test_train.py): trains in seconds on 2 ranks.
NUM_FEATURES = 16
SOURCE: dict[str, Any] = {"num_nodes": 3000, "avg_degree": 10.0, "num_features": NUM_FEATURES, "num_classes": 4,
                          "seed": 1, "split": (0.2, 0.1, 0.7)}

# (source dtype, features.dtype) -> stored dtype, as the README and stages/features/dtypes.py say
STORED = {
    ("float64", "auto"): "float32", ("float32", "auto"): "float32", ("float16", "auto"): "float16",
    ("bool", "auto"): "bool", ("int8", "auto"): "int8", ("uint8", "auto"): "uint8",
    ("int16", "auto"): "float32", ("uint16", "auto"): "float32", ("int32", "auto"): "float32",
    ("int64", "auto"): "float32", ("uint64", "auto"): "float32", (">f8", "auto"): "float32",
    (">f2", "auto"): "float16",
    ("float64", "float16"): "float16", ("float32", "float16"): "float16", ("bool", "float32"): "float32",
    ("float16", "float32"): "float32", ("uint8", "float16"): "float16",
}


@pytest.mark.parametrize(("source", "requested"), list(STORED), ids=[f"{s}-{r}" for s, r in STORED])
def test_storage_dtype_table(source: str, requested: str) -> None:
    assert storage_dtype(np.dtype(source), requested) == np.dtype(STORED[source, requested])  # type: ignore[arg-type]


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """The synthetic float32 features in ``dtype``: integers quantised (x * 4 rounded), bools their sign."""
    if dtype == "bool":
        return x > 0
    if np.dtype(dtype).kind in "iu":
        return np.round(x * 4).astype(dtype)
    return x.astype(dtype)


@pytest.fixture(scope="module")
def source_graph():
    return generate_synthetic(SOURCE["num_nodes"], SOURCE["avg_degree"], NUM_FEATURES, SOURCE["num_classes"],
                              SOURCE["seed"], split=SOURCE["split"], progress=False)


def build(root: Path, path: Path, until: str = "hotness", **values: Any) -> tuple[ArtifactStore, dict]:
    return build_without_prefect({"artifacts": str(root), "dataset": "files", "path": str(path),
                                  "num_partitions": 2, "fanouts": FANOUTS, "batch_size": BATCH_SIZE,
                                  "until": until, **values})


def stored_x(store: ArtifactStore, manifests: dict) -> np.ndarray:
    """The feature stores' x in gid order."""
    art = FeaturesArtifact(store, manifests["features"])
    return np.concatenate([np.asarray(art.x(p)[:]) for p in range(manifests["features"].summary["num_partitions"])])


@pytest.mark.parametrize("dtype", ["float64", "float16", "int64", "uint8", "bool", ">f4"])
def test_stored_dtype_and_values(tmp_path: Path, source_graph, dtype: str) -> None:
    """Download keeps the file's dtype; features stores the documented one, with the values cast exactly."""
    x = as_dtype(source_graph.x, dtype)
    store, m = build(tmp_path / "art", write_files(tmp_path / "g", source_graph, x), until="features")
    kept = GraphArtifact(store, m["download"]).read().x
    assert kept.dtype.name == x.dtype.name and np.array_equal(kept, x)
    want = np.dtype(STORED[dtype if dtype != ">f4" else "float32", "auto"])
    got = stored_x(store, m)
    book = PartitionArtifact(store, m["partition"]).book()
    assert got.dtype == want and np.array_equal(got, x[book.orig_of_gid].astype(want))
    s = m["features"].summary
    assert (s["feature_dtype"], s["source_dtype"]) == (want.name, x.dtype.name)
    assert s["bytes_features"] == x.shape[0] * NUM_FEATURES * want.itemsize
    assert FeaturesArtifact(store, m["features"]).row_bytes == NUM_FEATURES * want.itemsize


# the four source dtypes the issue names; each trains on 2 ranks (~10-20 s each)
TRAINED = ["float64", "float16", "int64", "bool"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", TRAINED)
def test_any_numeric_x_trains_on_two_ranks(tmp_path: Path, source_graph, dtype: str) -> None:
    x = as_dtype(source_graph.x, dtype)
    store, m = build(tmp_path / "art", write_files(tmp_path / "g", source_graph, x), cache_ratio=0.2)
    row_bytes = NUM_FEATURES * np.dtype(STORED[dtype, "auto"]).itemsize
    for p in range(2):   # the cache budget is counted in stored rows
        plan = HotnessArtifact(store, m["hotness"]).plan(p)
        assert plan.attrs["row_bytes"] == row_bytes and plan.attrs["plan_bytes"] == plan.attrs["plan_rows"] * row_bytes
    run = train.run(store, train_params(epochs=4), train_upstream(m), log=lambda line: None)
    metrics = json.loads(store.read_bytes("train", run.key, METRICS))
    epochs = metrics["epochs"]
    assert all(math.isfinite(e["loss"]) for e in epochs) and epochs[-1]["loss"] < epochs[0]["loss"]
    assert (TrainSummary.from_json(run.summary).test_metric or 0.0) > 0.5, run.summary   # chance 0.25
    for e in epochs:   # the train metrics count the stored row's bytes
        assert e["remote_rows"] > 0 and e["remote_bytes"] == e["remote_rows"] * row_bytes
        assert e["cached_bytes"] == e["cached_rows"] * row_bytes


NAN_AT, INF_AT = (1234, 7), (2000, 0)


def poisoned(x: np.ndarray, value: float, at: tuple[int, int], earlier: tuple[int, int] | None = None) -> np.ndarray:
    x = x.copy()
    x[at] = value
    if earlier is not None:
        x[earlier] = -value
    return x


def test_first_non_finite_is_the_first_in_row_major_order_across_blocks(source_graph) -> None:
    x = source_graph.x
    assert first_non_finite(x) is None and first_non_finite(x > 0) is None and first_non_finite(x[:0]) is None
    # NaNs at (1234, 7) and (1234, 9), an Inf at (1500, 0): the first in row-major order, whatever the blocks
    bad = poisoned(x, np.nan, (1234, 9), earlier=(1234, 7))
    bad[1500, 0] = np.inf
    for block_rows in (None, 1, 100, 1234, 1235, 10_000):
        assert first_non_finite(bad, block_rows=block_rows) == (1234, 7)
        assert first_non_finite(bad.astype(np.float16), block_rows=block_rows) == (1234, 7)
    assert first_non_finite(poisoned(x, -np.inf, (2999, 15))) == (2999, 15)


@pytest.mark.parametrize(("dtype", "value", "at", "kind"), [
    ("float32", np.nan, NAN_AT, "NaN"), ("float64", np.inf, INF_AT, "Inf"), ("float16", -np.inf, INF_AT, "-Inf")])
def test_files_with_nan_or_inf_are_refused_at_download_leaving_nothing(tmp_path: Path, source_graph, dtype: str,
                                                                      value: float, at: tuple[int, int],
                                                                      kind: str) -> None:
    d = write_files(tmp_path / "g", source_graph, poisoned(source_graph.x.astype(dtype), value, at))
    store = ArtifactStore(tmp_path / "art")
    with pytest.raises(InputError) as err:
        download.run(store, download.Params(dataset="files", path=str(d)), {}, progress=False)
    assert str(err.value) == (f"x.npy in {d} has {kind} at row {at[0]}, column {at[1]} (the first non-finite value); "
                              "features must be finite: replace or impute them (e.g. numpy.nan_to_num) and save again")
    assert not (tmp_path / "art" / "download").exists(), "no artifact, not even a half-written one"


def test_other_sources_name_the_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source_graph_nan = generate_synthetic(500, 5.0, 8, 3, 0, progress=False)
    source_graph_nan.x[17, 3] = np.nan
    monkeypatch.setattr(download, "generate_synthetic", lambda *a, **k: source_graph_nan)   # as the stage calls it
    store = ArtifactStore(tmp_path / "art")
    with pytest.raises(InputError, match=r"^the features \(x\) of dataset synthetic has NaN at row 17, column 3 "
                                         r"\(the first non-finite value\)"):
        download.run(store, download.Params(num_nodes=500), {}, progress=False)
    assert not (tmp_path / "art" / "download").exists()


@pytest.mark.parametrize(("dtype", "requested", "value", "limit"), [
    ("float32", "float16", 70000.0, "float16 (|x| <= 65504)"),
    ("float64", "auto", -1e39, "float32 (|x| <= 3.40282e+38)"),
    ("int32", "float16", 65520, "float16 (|x| <= 65504)")])
def test_a_cast_that_overflows_is_refused_naming_the_node(tmp_path: Path, source_graph, dtype: str,
                                                          requested: str, value: float, limit: str) -> None:
    x = as_dtype(source_graph.x, dtype)
    x[NAN_AT] = value
    d = write_files(tmp_path / "g", source_graph, x)
    with pytest.raises(InputError) as err:
        build(tmp_path / "art", d, until="features", dtype=requested)
    assert str(err.value) == (f"x has {x[NAN_AT].item()} at row {NAN_AT[0]}, column {NAN_AT[1]}, beyond the range "
                              f"of {limit}; set features.dtype=float32")
    assert not (tmp_path / "art" / "features").exists()
