"""The infer artifact format: per-partition outputs written by the ranks, and their exports in orig-id order.

ID spaces (docs/design.md §4): a part's rows are the **lids** of partition p (row i is gid ``start_gid + i``); the
exports' rows are **orig** ids (row i is the dataset's node i), so they join the dataset's own tables on
``orig_id``.

Artifact ``infer/<key>/``:

- ``part-<p>.zarr`` (written by rank p: ``open_part_outputs``, ``write_part_embedding``,
  ``write_part_predictions``): ``pred`` int64 [n_p] (argmax class), ``prob`` float32 [n_p, C] (softmax of the
  logits), ``emb/layer-<l>`` float32 [n_p, H_l] for each stored hidden layer l (0-based: layer l's output after
  its activation and norm, the input of layer l + 1; the last hidden layer is ``L - 2`` of an L-layer model), and
  ``orig_id`` int64 [n_p] (added by the stage's export). Attrs: part, start_gid, num_nodes, num_classes,
  embedding_layers.
- ``nodes.zarr``: the same in orig-id order (row i = orig id i): ``pred`` [N], ``prob`` [N, C], ``label`` int64 [N]
  (-1 = unlabelled), ``split`` int8 [N] (``SPLIT_CODES``: 0 train, 1 valid, 2 test, -1 none), ``emb/layer-<l>``
  [N, H_l]. Attrs: num_nodes, num_classes, embedding_layers, split_codes.
- ``predictions.parquet``: one row per node in orig-id order (one row group per export chunk): ``orig_id`` int64,
  ``pred`` int64, ``prob_<c>`` float32 for each class c, ``label`` int64 (-1 = unlabelled), ``split`` (dictionary
  of train / valid / test; null for none).
- A typed graph (orig ids numbered type after type, ``GraphSchema.orig_offsets()``): ``nodes.zarr`` also has
  ``node_type`` int8 [N] (attr ``node_types``: the names), and ``predictions.parquet`` ``node_type`` (dictionary)
  and ``type_orig_id`` int64 (the id within the type) after ``orig_id``. Every node gets the output layer's
  prediction; only the labelled types' are what the model was trained for (the hidden layers' rows of every type
  are the embeddings to use elsewhere).
- A link prediction model's artifact (attr ``task`` = ``link``; no classes, so no pred, prob, label, split and no
  ``predictions.parquet``): each part holds ``emb/out`` float32 [n_p, D] (the encoder's output layer: the node
  embeddings the train artifact's decoder scores pairs from, ``D`` = train's ``hidden``) beside its stored hidden
  layers, and ``nodes.zarr`` the same in orig-id order (``LINK_EMBEDDINGS``; typed: ``node_type`` too). Attrs:
  part, start_gid, num_nodes, task, embedding_width, embedding_layers.
- ``metrics.json``: the stage's figures (``stages.infer.stage``), with the flat ``scalars`` a tracker logs.

While it runs, the job directory (``storage.leftovers.infer_job_dir``) holds ``spec.json`` (the job spec the ranks
read, ``stages.infer.spec.InferSpec``), ``result/`` (rank 0's ``ranks.json``: every rank's figures; a failing rank's
``error-<r>.json``) and ``scratch/`` (layer matrices past the host memory budget, ``stages.infer.matrices``).

Every Zarr array carries the crc32c codec (``storage.zarr_io``). pyarrow is imported only where Parquet is
written or read. This module writes the ranks' parts, ``storage.infer_export`` the exports;
``storage.infer_artifact.InferArtifact`` reads the artifact.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from storage.graph import SPLITS
from storage.parallel import WRITE_THREADS
from storage.writer import StageWriter
from storage.zarr_io import open_group, open_subgroup, write_array

NODES = "nodes.zarr"
PREDICTIONS = "predictions.parquet"
METRICS = "metrics.json"
SPLIT_CODES: dict[str, int] = {name: code for code, name in enumerate(SPLITS)}   # -1: in no split
PART_CHUNK_ROWS = 1 << 14     # a part's rows per chunk: an export chunk reads few rows it does not use
OUT = "out"                   # emb/out: a link model's node embeddings (its output layer's rows)
LINK_EMBEDDINGS = f"{NODES}/emb/{OUT}"


def job_spec_path(job: Path) -> Path:
    return job / "spec.json"


def job_result_dir(job: Path) -> Path:
    return job / "result"


def job_scratch_dir(job: Path) -> Path:
    return job / "scratch"


def ranks_path(result_dir: str | os.PathLike[str]) -> str:
    """Where rank 0 leaves every rank's figures (a JSON list, one record per rank) for the stage."""
    return os.path.join(result_dir, "ranks.json")


def part_name(p: int) -> str:
    return f"part-{p}.zarr"


def layer_name(layer: int) -> str:
    return f"layer-{layer}"


# ---- the ranks' outputs -------------------------------------------------------------------------------------------
def open_part_outputs(artifact_url: str, part: int) -> zarr.Group:
    """Rank ``part``'s ``part-<part>.zarr`` in the artifact being written at ``artifact_url`` (the stage's
    ``StageWriter.url``, which the job spec hands the ranks): ``write_part_embedding`` as each hidden layer is done,
    then ``write_part_predictions`` last."""
    return open_group(f"{artifact_url}/{part_name(part)}", mode="w")


def _emb_group(group: zarr.Group) -> zarr.Group:
    return open_subgroup(group, "emb") if "emb" in group else group.create_group("emb")


def _write_part_rows(group: zarr.Group, name: str, rows: np.ndarray, dtype: type) -> None:
    """A part's array of rows by lid, as ``dtype``: ``PART_CHUNK_ROWS`` a chunk, a few chunks at once (the ranks'
    outputs are in memory, so each chunk is a view)."""
    write_array(group, name, rows.astype(dtype, copy=False), chunk_rows=PART_CHUNK_ROWS, threads=WRITE_THREADS)


def write_part_embedding(group: zarr.Group, layer: int, rows: np.ndarray) -> None:
    """Hidden layer ``layer``'s rows (by lid) of the part ``group``."""
    _write_part_rows(_emb_group(group), layer_name(layer), rows, np.float32)


def write_part_link_embeddings(group: zarr.Group, *, part: int, start_gid: int, emb: np.ndarray,
                               embedding_layers: Sequence[int]) -> None:
    """A link model's node embeddings (its output layer's rows, by lid) and the part's attrs (written last)."""
    _write_part_rows(_emb_group(group), OUT, emb, np.float32)
    group.attrs.update({"part": part, "start_gid": int(start_gid), "num_nodes": int(emb.shape[0]), "task": "link",
                        "embedding_width": int(emb.shape[1]),
                        "embedding_layers": sorted(int(k) for k in embedding_layers)})


def write_part_predictions(group: zarr.Group, *, part: int, start_gid: int, pred: np.ndarray, prob: np.ndarray,
                           embedding_layers: Sequence[int]) -> None:
    """The part's predicted classes and probabilities (by lid), and its attrs (written last: a part without them
    is incomplete)."""
    if "emb" not in group:
        group.create_group("emb")
    _write_part_rows(group, "pred", pred, np.int64)
    _write_part_rows(group, "prob", prob, np.float32)
    group.attrs.update({"part": part, "start_gid": int(start_gid), "num_nodes": int(pred.shape[0]),
                        "num_classes": int(prob.shape[1]), "embedding_layers": sorted(int(k) for k in
                                                                                      embedding_layers)})


# ---- the export in orig-id order: storage.infer_export ----------------------------------------------------
def read_rows(array: zarr.Array, lid: np.ndarray) -> np.ndarray:
    """``array[lid]`` for sorted lids: one slice read when they are contiguous (a book from the partition stage
    keeps orig order within a part, so an orig range is a lid range), else the touched chunks only."""
    if lid.size == 0:
        return np.empty((0, *array.shape[1:]), dtype=array.dtype)
    lo, hi = int(lid[0]), int(lid[-1]) + 1
    if hi - lo == lid.size:
        return np.asarray(array[lo:hi])
    return np.asarray(array.get_orthogonal_selection((lid,)))


def write_metrics(writer: StageWriter, metrics: dict[str, Any]) -> None:
    writer.write_json(METRICS, metrics)
