"""``gnnpipe export infer --format parquet|zarr|npy --out DIR``: an infer build's outputs in orig-id order, as files
other tools read without gnnpipe.

The build is the one ``gnnpipe show infer`` would print (``flows.cli_store.find_build``: KEY, the
``--config``/``--set`` given, or the only infer build); it is read through ``storage.infer_artifact.InferArtifact``.

- ``parquet``: ``predictions.parquet`` (orig_id, pred, prob_<c>, label, split), copied as it is;
- ``zarr``: the ``nodes.zarr`` group (pred, prob, label, split, emb/layer-<l>; crc32c codec), copied as it is;
- ``npy``: ``orig_id.npy``, ``pred.npy``, ``prob.npy``, ``label.npy``, ``split.npy`` and ``emb_layer_<l>.npy`` per
  stored hidden layer, row i = orig id i, written a chunk of rows at a time (memory: one chunk). A link prediction
  model's build (no classes): ``orig_id.npy``, ``emb_out.npy`` (its node embeddings) and ``emb_layer_<l>.npy``;
  it has no Parquet file to export.

Each export adds ``export.json`` (the build's keys, sizes, embedding layers, split codes and the files). A file is
written under a temporary name and renamed into place: an interrupted export leaves no half-written file under its
final name. DIR must be empty (or absent) unless ``--force``, which replaces the files of the same names and leaves
the others; a failed export removes DIR again when it created it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import typer
import zarr

from flows import cli_store
from flows.cli_store import ARTIFACTS, BUILD_KEY, CONFIG, SETS
from storage import InputError
from storage.infer import NODES, PREDICTIONS, SPLIT_CODES
from storage.infer_artifact import InferArtifact

FORMATS = ("parquet", "zarr", "npy")
EXPORT_JSON = "export.json"


def export(stage: str = typer.Argument(..., metavar="STAGE", help="the stage whose outputs to export: infer"),
           key: str | None = BUILD_KEY,
           format_: str = typer.Option(..., "--format", "-f", help=f"one of {', '.join(FORMATS)}"),
           out: Path = typer.Option(..., "--out", "-o", help="directory to write into (created if absent)"),
           force: bool = typer.Option(False, "--force", help="write into a non-empty DIR, replacing files of the "
                                                             "same names"),
           config: Path | None = CONFIG, set_: list[str] = SETS, artifacts: str | None = ARTIFACTS) -> None:
    """Export an infer build's predictions and embeddings in orig-id order: Parquet, a Zarr group, or .npy files."""
    if stage != "infer":
        raise InputError(f"gnnpipe export takes the infer stage (predictions and embeddings), not '{stage}'; "
                         f"`gnnpipe show {stage}` prints a build's report")
    if format_ not in FORMATS:
        raise InputError(f"--format {format_!r} is not one of {', '.join(FORMATS)}")
    _check_out(out, force)
    store, manifest = cli_store.find_build("infer", key, config, set_, artifacts)
    art = InferArtifact(store, manifest)
    if format_ == "parquet" and not art.has_classes:
        raise InputError(f"infer/{manifest.key} holds a link prediction model's node embeddings, no "
                         f"{PREDICTIONS}: export them with --format npy or zarr")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        files = WRITERS[format_](art, out)
        meta: dict[str, Any] = {
            "stage": "infer", "key": manifest.key, "artifact": manifest.uri, "task": art.task,
            "train_key": manifest.upstream.get("train"), "format": format_, "order": "orig_id",
            "num_nodes": art.num_nodes, "num_classes": art.num_classes,
            "embedding_layers": art.embedding_layers, "files": files}
        if art.has_classes:
            meta["split_codes"] = {**SPLIT_CODES, "none": -1}
        _atomic(out / EXPORT_JSON, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n"))
    except BaseException:
        if created:   # no empty (or partial) DIR left behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    typer.echo(f"exported infer/{manifest.key} ({meta['num_nodes']:,} nodes, orig-id order) as {format_} to {out}: "
               f"{', '.join([*files, EXPORT_JSON])}")


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError(f"--out {out} is not empty; pass --force to write the export into it (files of the same "
                         f"names are replaced, others are kept)")


def _atomic(path: Path, write: Callable[[Path], object]) -> None:
    """``write`` a temporary sibling of ``path`` (a file or a directory), then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write(tmp)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def _copy_url(url: str, path: Path) -> None:
    """A file or a directory tree of the artifact root (a local path or an fsspec URL) to a local ``path``."""
    import fsspec

    fs, src = fsspec.core.url_to_fs(url)
    if fs.isdir(src):
        path.mkdir()
        for entry in fs.find(src, withdirs=False):
            target = path / os.path.relpath(entry, src)
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(entry, str(target))
    else:
        fs.get_file(src, str(path))


def _parquet(art: InferArtifact, out: Path) -> list[str]:
    _atomic(out / PREDICTIONS, lambda tmp: _copy_url(art.predictions_url, tmp))
    return [PREDICTIONS]


def _zarr(art: InferArtifact, out: Path) -> list[str]:
    _atomic(out / NODES, lambda tmp: _copy_url(art.nodes_url, tmp))
    return [NODES]


def _npy(art: InferArtifact, out: Path) -> list[str]:
    # what the build holds: a link model's node embeddings (emb/out) or a classifier's class arrays; hidden layers
    arrays = {"emb_out": art.embeddings()} if art.has_output_embeddings else {}
    arrays.update({name: art.node_array(name) for name in art.class_arrays})
    arrays.update({f"emb_layer_{layer}": art.embeddings(layer) for layer in art.embedding_layers})
    num_nodes = art.num_nodes
    _atomic(out / "orig_id.npy", partial(_save, np.arange(num_nodes, dtype=np.int64)))
    for name, array in arrays.items():
        _atomic(out / f"{name}.npy", partial(_save_rows, array))
    return ["orig_id.npy", *(f"{name}.npy" for name in arrays)]


def _save(data: np.ndarray, path: Path) -> None:
    with open(path, "wb") as f:   # np.save(path) would append ".npy" to the temporary name
        np.save(f, data, allow_pickle=False)


def _save_rows(array: zarr.Array, path: Path) -> None:
    """A Zarr array into a .npy file one chunk of rows at a time."""
    target = np.lib.format.open_memmap(path, mode="w+", dtype=array.dtype, shape=array.shape)
    step = max(1, int(array.chunks[0]))
    for start in range(0, array.shape[0], step):
        target[start:start + step] = array[start:start + step]
    target.flush()
    del target


WRITERS: dict[str, Callable[[InferArtifact, Path], list[str]]] = {"parquet": _parquet, "zarr": _zarr, "npy": _npy}


def register(app: typer.Typer) -> None:
    app.command()(export)
