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

Every Zarr array carries the crc32c codec (``storage.zarr_io``). pyarrow is imported only where Parquet is
written or read. This module writes the artifact; ``storage.infer_artifact.InferArtifact`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from storage.graph import SPLITS
from storage.partition import PartitionBook
from storage.schema import GraphSchema
from storage.store import StageWriter
from storage.zarr_io import open_array, open_group, open_subgroup, write_array

NODES = "nodes.zarr"
PREDICTIONS = "predictions.parquet"
METRICS = "metrics.json"
SPLIT_CODES: dict[str, int] = {name: code for code, name in enumerate(SPLITS)}   # -1: in no split
PART_CHUNK_ROWS = 1 << 14     # a part's rows per chunk: an export chunk reads few rows it does not use
EXPORT_CHUNK_BYTES = 64 << 20
OUT = "out"                   # emb/out: a link model's node embeddings (its output layer's rows)
LINK_EMBEDDINGS = f"{NODES}/emb/{OUT}"


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


def write_part_embedding(group: zarr.Group, layer: int, rows: np.ndarray) -> None:
    """Hidden layer ``layer``'s rows (by lid) of the part ``group``."""
    emb = _emb_group(group)
    write_array(emb, layer_name(layer), rows.astype(np.float32, copy=False), chunk_rows=PART_CHUNK_ROWS)


def write_part_link_embeddings(group: zarr.Group, *, part: int, start_gid: int, emb: np.ndarray,
                               embedding_layers: Sequence[int]) -> None:
    """A link model's node embeddings (its output layer's rows, by lid) and the part's attrs (written last)."""
    write_array(_emb_group(group), OUT, emb.astype(np.float32, copy=False), chunk_rows=PART_CHUNK_ROWS)
    group.attrs.update({"part": part, "start_gid": int(start_gid), "num_nodes": int(emb.shape[0]), "task": "link",
                        "embedding_width": int(emb.shape[1]),
                        "embedding_layers": sorted(int(k) for k in embedding_layers)})


def write_part_predictions(group: zarr.Group, *, part: int, start_gid: int, pred: np.ndarray, prob: np.ndarray,
                           embedding_layers: Sequence[int]) -> None:
    """The part's predicted classes and probabilities (by lid), and its attrs (written last: a part without them
    is incomplete)."""
    if "emb" not in group:
        group.create_group("emb")
    write_array(group, "pred", pred.astype(np.int64, copy=False), chunk_rows=PART_CHUNK_ROWS)
    write_array(group, "prob", prob.astype(np.float32, copy=False), chunk_rows=PART_CHUNK_ROWS)
    group.attrs.update({"part": part, "start_gid": int(start_gid), "num_nodes": int(pred.shape[0]),
                        "num_classes": int(prob.shape[1]), "embedding_layers": sorted(int(k) for k in
                                                                                      embedding_layers)})


# ---- the export in orig-id order ----------------------------------------------------------------------------------
def export_rows(num_classes: int, widths: Sequence[int]) -> int:
    """Orig ids per export chunk: about ``EXPORT_CHUNK_BYTES`` of outputs, within [8 192, 1 048 576] rows."""
    row_bytes = 8 * 3 + 1 + 4 * (num_classes + sum(widths))
    return int(min(1 << 20, max(8192, EXPORT_CHUNK_BYTES // row_bytes)))


def _create(group: zarr.Group, name: str, shape: tuple[int, ...], dtype: Any, chunk_rows: int) -> zarr.Array:
    """An empty row-chunked array with the crc32c codec (``storage.zarr_io.write_array``'s layout), written chunk
    by chunk."""
    return group.create_array(name, shape=shape, dtype=dtype, chunks=(max(1, min(chunk_rows, shape[0] or 1)),
                                                                       *shape[1:]),
                              compressors=[zarr.codecs.Crc32cCodec()], fill_value=0, overwrite=True)


def read_rows(array: zarr.Array, lid: np.ndarray) -> np.ndarray:
    """``array[lid]`` for sorted lids: one slice read when they are contiguous (a book from the partition stage
    keeps orig order within a part, so an orig range is a lid range), else the touched chunks only."""
    if lid.size == 0:
        return np.empty((0, *array.shape[1:]), dtype=array.dtype)
    lo, hi = int(lid[0]), int(lid[-1]) + 1
    if hi - lo == lid.size:
        return np.asarray(array[lo:hi])
    return np.asarray(array.get_orthogonal_selection((lid,)))


Pieces = list[tuple[int, np.ndarray, np.ndarray]]   # (part, its sorted lids, their positions in the chunk)


def _pieces(bounds: np.ndarray, gid: np.ndarray) -> Pieces:
    """A chunk of gids cut by owning part, each part's lids sorted (``read_rows`` reads a lid range as one slice)."""
    owner = np.searchsorted(bounds, gid, side="right") - 1
    out = []
    for p in np.unique(owner).tolist():
        pos = np.flatnonzero(owner == p)
        lid = gid[pos] - bounds[p]
        order = np.argsort(lid, kind="stable")
        out.append((p, lid[order], pos[order]))
    return out


def _gather(arrays: Sequence[zarr.Array], pieces: Pieces, out: np.ndarray) -> np.ndarray:
    """``out`` filled with the parts' rows of a chunk (``arrays[p]``: part p's array)."""
    for p, lid, pos in pieces:
        out[pos] = read_rows(arrays[p], lid)
    return out


def _parts_with_orig_id(writer: StageWriter, book: PartitionBook) -> list[zarr.Group]:
    """The ranks' ``part-<p>.zarr``, each given its rows' ``orig_id``."""
    parts = [open_group(writer.file_url(part_name(p)), mode="r+") for p in range(book.num_partitions)]
    for p, g in enumerate(parts):
        write_array(g, "orig_id", book.orig_of_gid[book.bounds[p]:book.bounds[p + 1]], chunk_rows=PART_CHUNK_ROWS)
    return parts


def _chunk_starts(num_nodes: int, rows: int, progress: bool) -> Iterator[int]:
    from storage.progress import progress as tqdm

    starts = range(0, num_nodes, rows)
    yield from tqdm(starts, desc="infer: export in orig-id order", unit="chunk", leave=False,
                    disable=not progress or len(starts) < 4)


def export_orig_order(writer: StageWriter, *, book: PartitionBook, label_of_gid: np.ndarray,
                      split_of_gid: np.ndarray, num_classes: int, embedding_layers: Sequence[int],
                      schema: GraphSchema, chunk_rows: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Read the ranks' ``part-<p>.zarr`` outputs back and write ``nodes.zarr`` and ``predictions.parquet`` in orig-id
    order, one chunk of orig ids at a time (memory: one chunk's rows, plus the book's and the labels' N-long integer
    arrays); add ``orig_id`` to each part. ``split_of_gid``: int8 ``SPLIT_CODES`` (-1: none). A typed graph's
    exports also name each node's type and its id within the type (``schema.orig_offsets()``). Returns figures."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    num_nodes, bounds = book.num_nodes, book.bounds
    parts = _parts_with_orig_id(writer, book)
    preds = [open_array(g, "pred") for g in parts]
    probs = [open_array(g, "prob") for g in parts]
    embs = {layer: [open_array(open_subgroup(g, "emb"), layer_name(layer)) for g in parts]
            for layer in embedding_layers}
    widths = {layer: int(arrays[0].shape[1]) for layer, arrays in embs.items()}
    rows = chunk_rows or export_rows(num_classes, list(widths.values()))

    out = open_group(writer.file_url(NODES), mode="w")
    pred_out = _create(out, "pred", (num_nodes,), np.int64, rows)
    prob_out = _create(out, "prob", (num_nodes, num_classes), np.float32, rows)
    label_out = _create(out, "label", (num_nodes,), np.int64, rows)
    split_out = _create(out, "split", (num_nodes,), np.int8, rows)
    emb_group = out.create_group("emb")
    emb_out = {layer: _create(emb_group, layer_name(layer), (num_nodes, w), np.float32, rows)
               for layer, w in widths.items()}
    out.attrs.update({"num_nodes": num_nodes, "num_classes": num_classes,
                      "embedding_layers": sorted(widths), "split_codes": SPLIT_CODES})
    types = _TypeColumns(schema)
    type_out = types.zarr_array(out, rows)

    prob_names = [f"prob_{c}" for c in range(num_classes)]
    table_schema = pa.schema([("orig_id", pa.int64()), *types.fields(), ("pred", pa.int64()),
                              *[(n, pa.float32()) for n in prob_names], ("label", pa.int64()),
                              ("split", pa.dictionary(pa.int8(), pa.string()))])
    split_names = pa.array(list(SPLITS), type=pa.string())
    import fsspec

    with fsspec.open(writer.file_url(PREDICTIONS), "wb") as f, pq.ParquetWriter(f, table_schema) as table_writer:
        for start in _chunk_starts(num_nodes, rows, progress):
            stop = min(start + rows, num_nodes)
            gid = book.gid_of_orig[start:stop]
            pieces = _pieces(bounds, gid)
            pred = _gather(preds, pieces, np.empty(stop - start, dtype=np.int64))
            prob = _gather(probs, pieces, np.empty((stop - start, num_classes), dtype=np.float32))
            emb = {layer: _gather(arrays, pieces, np.empty((stop - start, widths[layer]), dtype=np.float32))
                   for layer, arrays in embs.items()}
            label, split = label_of_gid[gid], split_of_gid[gid]
            pred_out[start:stop], prob_out[start:stop] = pred, prob
            label_out[start:stop], split_out[start:stop] = label, split
            for layer, rows_out in emb.items():
                emb_out[layer][start:stop] = rows_out
            split_col = pa.DictionaryArray.from_arrays(pa.array(split, mask=split < 0), split_names)
            orig = np.arange(start, stop, dtype=np.int64)
            columns = [pa.array(orig), *types.columns(orig, type_out, start), pa.array(pred),
                       *[pa.array(prob[:, c]) for c in range(num_classes)], pa.array(label), split_col]
            table_writer.write_table(pa.Table.from_arrays(columns, schema=table_schema))
    return {"export_chunk_rows": rows, "exported_nodes": num_nodes}


def export_link_embeddings(writer: StageWriter, *, book: PartitionBook, embedding_layers: Sequence[int],
                           schema: GraphSchema, chunk_rows: int | None = None, progress: bool = False
                           ) -> dict[str, Any]:
    """A link model's ``nodes.zarr`` in orig-id order: ``emb/out`` and the stored hidden layers (typed: and
    ``node_type``), a chunk of orig ids at a time; adds ``orig_id`` to each part. Returns figures."""
    num_nodes = book.num_nodes
    parts = _parts_with_orig_id(writer, book)
    names = [OUT, *(layer_name(layer) for layer in embedding_layers)]
    sources = {name: [open_array(open_subgroup(g, "emb"), name) for g in parts] for name in names}
    widths = {name: int(arrays[0].shape[1]) for name, arrays in sources.items()}
    rows = chunk_rows or export_rows(0, list(widths.values()))
    out = open_group(writer.file_url(NODES), mode="w")
    emb_group = out.create_group("emb")
    targets = {name: _create(emb_group, name, (num_nodes, w), np.float32, rows) for name, w in widths.items()}
    out.attrs.update({"num_nodes": num_nodes, "task": "link", "embedding_width": widths[OUT],
                      "embedding_layers": sorted(int(k) for k in embedding_layers)})
    types = _TypeColumns(schema)
    type_out = types.zarr_array(out, rows)
    for start in _chunk_starts(num_nodes, rows, progress):
        stop = min(start + rows, num_nodes)
        pieces = _pieces(book.bounds, book.gid_of_orig[start:stop])
        for name, arrays in sources.items():
            targets[name][start:stop] = _gather(arrays, pieces, np.empty((stop - start, widths[name]), np.float32))
        if type_out is not None:
            types.codes(np.arange(start, stop, dtype=np.int64), type_out, start)
    return {"export_chunk_rows": rows, "exported_nodes": num_nodes}


class _TypeColumns:
    """A typed graph's extra export columns: ``node_type`` (its name; int8 codes in ``nodes.zarr``, names in its
    ``node_types`` attr) and ``type_orig_id`` (the node's id within its type: the row of the dataset's per-type
    tables). None for a homogeneous graph, whose exports stay as they were."""

    def __init__(self, schema: GraphSchema) -> None:
        self.names = [t.name for t in schema.node_types]
        self.offsets = schema.orig_offsets()
        self.typed = not schema.is_homogeneous

    def zarr_array(self, out: zarr.Group, rows: int) -> zarr.Array | None:
        if not self.typed:
            return None
        out.attrs["node_types"] = self.names
        return _create(out, "node_type", (int(self.offsets[-1]),), np.int8, rows)

    def fields(self) -> list[Any]:
        import pyarrow as pa

        if not self.typed:
            return []
        return [("node_type", pa.dictionary(pa.int8(), pa.string())), ("type_orig_id", pa.int64())]

    def codes(self, orig: np.ndarray, array: zarr.Array | None, start: int) -> np.ndarray:
        """The node types of the chunk of orig ids ``orig`` (from ``start``), written to ``array``."""
        code = (np.searchsorted(self.offsets, orig, side="right") - 1).astype(np.int8)
        if array is not None:
            array[start:start + orig.shape[0]] = code
        return code

    def columns(self, orig: np.ndarray, array: zarr.Array | None, start: int) -> list[Any]:
        """The chunk of orig ids ``orig`` (from ``start``): its node types written to ``array``, and the columns."""
        import pyarrow as pa

        if not self.typed or array is None:
            return []
        code = self.codes(orig, array, start)
        names = pa.array(self.names, type=pa.string())
        return [pa.DictionaryArray.from_arrays(pa.array(code), names), pa.array(orig - self.offsets[code])]


def write_metrics(writer: StageWriter, metrics: dict[str, Any]) -> None:
    writer.write_json(METRICS, metrics)
