"""``gnnpipe export infer --format parquet|zarr|npy --out DIR``: each format holds the infer build's outputs in
orig-id order, the build is picked as ``gnnpipe show`` picks it, and a non-empty DIR is refused without --force."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from typer.testing import CliRunner

from flows.cli import app
from flows.cli_export import _save_rows
from stages.infer import stage as infer
from stages.infer.params import Params
from storage import ArtifactStore, InputError, Manifest
from storage.infer import SPLIT_CODES
from storage.infer_artifact import InferArtifact
from tests._infer_pipeline import build_to_train
from tests.conftest import GNNPIPE, REPO, cli_env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, Manifest]:
    """One partition, a 3-layer GraphSAGE, both hidden layers stored: the only infer build of its root."""
    store, manifests = build_to_train(str(tmp_path_factory.mktemp("art")), 1, fanouts=(5, 5, 5))
    params = Params(threads_per_rank=1, timeout_s=300.0, peer_timeout_s=60.0, embeddings="all")
    return store, infer.run(store, params, {u: manifests[u] for u in infer.UPSTREAM}, progress=False)


def export(store: ArtifactStore, *args: str) -> Any:
    result = CliRunner().invoke(app, ["export", "infer", *args, "--artifacts", store.root])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result


def meta(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "export.json").read_text()))


def test_parquet_is_the_predictions_table(built, tmp_path: Path):
    store, manifest = built
    out = tmp_path / "out"
    result = export(store, "--format", "parquet", "--out", str(out))
    assert f"exported infer/{manifest.key} (3,000 nodes, orig-id order) as parquet to {out}" in result.stdout
    table = pq.read_table(out / "predictions.parquet")
    assert table.equals(InferArtifact(store, manifest).predictions())
    np.testing.assert_array_equal(table["orig_id"].to_numpy(), np.arange(3000))
    m = meta(out)
    assert m["key"] == manifest.key and m["train_key"] == manifest.upstream["train"] and m["num_nodes"] == 3000
    assert m["files"] == ["predictions.parquet"] and m["embedding_layers"] == [0, 1] and m["format"] == "parquet"
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "predictions.parquet"]


def test_zarr_is_the_nodes_group(built, tmp_path: Path):
    store, manifest = built
    art = InferArtifact(store, manifest)
    out = tmp_path / "out"
    export(store, manifest.key[:6], "--format", "zarr", "--out", str(out))   # a key prefix picks the build too
    group = zarr.open_group(str(out / "nodes.zarr"), mode="r")
    assert dict(group.attrs) == dict(art.nodes().attrs)

    def read(name: str) -> np.ndarray:
        array = group[name]
        assert isinstance(array, zarr.Array)
        return np.asarray(array[:])

    for name in ("pred", "prob", "label", "split"):
        np.testing.assert_array_equal(read(name), np.asarray(art.node_array(name)[:]))
    for layer in (0, 1):
        np.testing.assert_array_equal(read(f"emb/layer-{layer}"), np.asarray(art.embeddings(layer)[:]))
    assert meta(out)["files"] == ["nodes.zarr"]


def test_npy_files_in_orig_id_order(built, tmp_path: Path):
    store, manifest = built
    art = InferArtifact(store, manifest)
    out = tmp_path / "out"
    export(store, "--format", "npy", "--out", str(out))
    names = ["orig_id.npy", "pred.npy", "prob.npy", "label.npy", "split.npy", "emb_layer_0.npy", "emb_layer_1.npy"]
    assert meta(out)["files"] == names and meta(out)["split_codes"] == {**SPLIT_CODES, "none": -1}
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "export.json"])
    np.testing.assert_array_equal(np.load(out / "orig_id.npy"), np.arange(3000))
    table = art.predictions()
    np.testing.assert_array_equal(np.load(out / "pred.npy"), table["pred"].to_numpy())
    prob = np.load(out / "prob.npy")
    assert prob.dtype == np.float32 and prob.shape == (3000, art.num_classes)
    np.testing.assert_array_equal(prob[:, 2], table["prob_2"].to_numpy())
    np.testing.assert_array_equal(np.load(out / "label.npy"), table["label"].to_numpy())
    split = np.load(out / "split.npy")
    assert [SPLIT_CODES.get(s, -1) if s else -1 for s in table["split"].to_pylist()] == split.tolist()
    for layer in (0, 1):
        emb = np.load(out / f"emb_layer_{layer}.npy")
        np.testing.assert_array_equal(emb, np.asarray(art.embeddings(layer)[:]))
        part = next(art.parts())
        assert part.orig_id is not None
        np.testing.assert_array_equal(emb[part.orig_id], part.embeddings[layer])   # row i is orig id i


def test_rows_are_copied_a_chunk_at_a_time(tmp_path: Path):
    data = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(7, 3), dtype=data.dtype)
    array[:] = data
    _save_rows(array, tmp_path / "a.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), data)


def test_a_non_empty_dir_needs_force(built, tmp_path: Path):
    store, manifest = built
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    proc = subprocess.run([*GNNPIPE, "export", "infer", "--format", "npy", "--out", str(out), "--artifacts",
                           store.root], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line == (f"error: --out {out} is not empty; pass --force to write the export into it (files of the same "
                    f"names are replaced, others are kept)")
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    export(store, "--format", "parquet", "--out", str(out), "--force")
    export(store, "--format", "parquet", "--out", str(out), "--force")   # replaces its own files
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "mine.txt", "predictions.parquet"]
    assert (out / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--format", "npy"], "gnnpipe export takes the infer stage (predictions and embeddings), not 'train'"),
    (["infer", "--format", "csv"], "--format 'csv' is not one of parquet, zarr, npy"),
])
def test_bad_stage_or_format(built, tmp_path: Path, args: list[str], message: str):
    store, _ = built
    result = CliRunner().invoke(app, ["export", *args, "--out", str(tmp_path / "out"), "--artifacts", store.root])
    assert isinstance(result.exception, InputError) and str(result.exception).startswith(message)
    assert not (tmp_path / "out").exists()


def test_a_missing_build_says_how_to_build_it(built, tmp_path: Path):
    store, _ = built
    result = CliRunner().invoke(app, ["export", "infer", "--format", "npy", "--out", str(tmp_path / "out"),
                                      "--artifacts", store.root, "--set", "epochs=7"])
    assert isinstance(result.exception, InputError)
    assert "rerun the pipeline to build it: gnnpipe run --until infer --set epochs=7" in str(result.exception)
