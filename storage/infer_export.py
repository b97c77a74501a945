"""The infer artifact's exports in orig-id order (``storage.infer`` describes the format): ``nodes.zarr`` and
``predictions.parquet`` from the ranks' ``part-<p>.zarr``, a chunk of orig ids at a time on each of a few threads.

In three steps, so that the chunks can be written by units elsewhere (``stages.infer.export_units``):

1. :func:`plan_export` (the stage): ``orig_id`` added to each part, ``nodes.zarr``'s arrays created (every one
   chunked by the same ``rows``, so a chunk of orig ids is one Zarr chunk of each) and its attrs; returns the
   :class:`ExportPlan`, a small picklable value.
2. :class:`ChunkWriter` (wherever it runs): a chunk's rows gathered from the parts and written into each array;
   two writers never share a chunk when each takes its own chunks.
3. :class:`PredictionsTable` (the stage, a node classifier's): one Parquet row group per chunk, in order, from the
   chunk's columns as step 2 returns them or as read back from ``nodes.zarr``: the same arrays, the same bytes.

``export_orig_order`` and ``export_link_embeddings`` run the three in one process, ``WRITE_THREADS`` chunks at a
time (``storage.parallel.in_order``: the Parquet's row groups still in order; a chunk's rows a thread).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from storage.graph import SPLITS
from storage.infer import NODES, OUT, PART_CHUNK_ROWS, PREDICTIONS, SPLIT_CODES, layer_name, part_name, read_rows
from storage.parallel import in_order
from storage.partition import PartitionBook
from storage.schema import GraphSchema
from storage.writer import StageWriter
from storage.zarr_io import open_array, open_group, open_subgroup, write_array

EXPORT_CHUNK_BYTES = 64 << 20
FEW_VALUED = ("node_type", "pred", "label", "split")   # predictions.parquet's columns that get dictionary pages


def export_rows(num_classes: int, widths: Sequence[int]) -> int:
    """Orig ids per export chunk: about ``EXPORT_CHUNK_BYTES`` of outputs, within [8 192, 1 048 576] rows."""
    row_bytes = 8 * 3 + 1 + 4 * (num_classes + sum(widths))
    return int(min(1 << 20, max(8192, EXPORT_CHUNK_BYTES // row_bytes)))


@dataclass(frozen=True)
class ExportPlan:
    """What the export writes (step 1's result): the artifact being written (``url``), the chunk ``rows``, the
    embedding arrays (``emb/<name>``, with their ``widths``); ``num_classes`` 0: a link model's (no pred, prob,
    label, split, no Parquet)."""

    url: str
    num_nodes: int
    rows: int
    num_classes: int
    names: tuple[str, ...]
    widths: tuple[int, ...]

    @property
    def starts(self) -> range:
        """Each chunk's first orig id."""
        return range(0, self.num_nodes, self.rows)

    def chunk(self, start: int) -> tuple[int, int]:
        return start, min(start + self.rows, self.num_nodes)


def plan_export(writer: StageWriter, *, book: PartitionBook, num_classes: int, names: Sequence[str],
                attrs: dict[str, Any], schema: GraphSchema, chunk_rows: int | None = None) -> ExportPlan:
    """Step 1: ``orig_id`` added to each part, ``nodes.zarr`` created with ``attrs`` (``names``: the parts'
    ``emb/<name>`` arrays to export; ``num_classes`` 0: a link model's)."""
    parts = _parts_with_orig_id(writer, book)
    widths = tuple(int(open_array(open_subgroup(parts[0], "emb"), name).shape[1]) for name in names)
    rows = chunk_rows or export_rows(num_classes, list(widths))
    n = book.num_nodes
    out = open_group(writer.file_url(NODES), mode="w")
    if num_classes:
        _create(out, "pred", (n,), np.int64, rows)
        _create(out, "prob", (n, num_classes), np.float32, rows)
        _create(out, "label", (n,), np.int64, rows)
        _create(out, "split", (n,), np.int8, rows)
    emb_group = out.create_group("emb")
    for name, width in zip(names, widths, strict=True):
        _create(emb_group, name, (n, width), np.float32, rows)
    out.attrs.update(attrs)
    _TypeColumns(schema).zarr_array(out, rows)
    return ExportPlan(writer.url, n, rows, num_classes, tuple(names), widths)


def _create(group: zarr.Group, name: str, shape: tuple[int, ...], dtype: Any, chunk_rows: int) -> zarr.Array:
    """An empty row-chunked array with the crc32c codec (``storage.zarr_io.write_array``'s layout), written chunk
    by chunk."""
    return group.create_array(name, shape=shape, dtype=dtype, chunks=(max(1, min(chunk_rows, shape[0] or 1)),
                                                                       *shape[1:]),
                              compressors=[zarr.codecs.Crc32cCodec()], fill_value=0, overwrite=True)


def _parts_with_orig_id(writer: StageWriter, book: PartitionBook) -> list[zarr.Group]:
    """The ranks' ``part-<p>.zarr``, each given its rows' ``orig_id``."""
    parts = [open_group(writer.file_url(part_name(p)), mode="r+") for p in range(book.num_partitions)]
    for p, g in enumerate(parts):
        write_array(g, "orig_id", book.orig_of_gid[book.bounds[p]:book.bounds[p + 1]], chunk_rows=PART_CHUNK_ROWS)
    return parts


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
    """``out`` filled with the parts' rows of a chunk (``arrays[p]``: part p's array); a chunk that is one part's
    rows in order (one partition: every chunk) is returned as read, without the copy into ``out``."""
    if len(pieces) == 1 and _is_identity(pieces[0][2], out.shape[0]):
        p, lid, _pos = pieces[0]
        return np.asarray(read_rows(arrays[p], lid), dtype=out.dtype)
    for p, lid, pos in pieces:
        out[pos] = read_rows(arrays[p], lid)
    return out


def _is_identity(pos: np.ndarray, n: int) -> bool:
    """Whether ``pos`` is ``0, 1, ..., n - 1``."""
    return pos.shape[0] == n and (n == 0 or (int(pos[0]) == 0 and bool((np.diff(pos) == 1).all())))


Columns = dict[str, np.ndarray]   # a node classifier's chunk: pred, prob, label, split (the Parquet's sources)


class ChunkWriter:
    """Step 2: writes chunks of ``plan`` into ``nodes.zarr`` (the parts and the target arrays opened once).
    ``label_of_gid``/``split_of_gid`` (a node classifier's): every gid's label and ``SPLIT_CODES`` (-1: none)."""

    def __init__(self, plan: ExportPlan, book: PartitionBook, schema: GraphSchema,
                 label_of_gid: np.ndarray | None = None, split_of_gid: np.ndarray | None = None) -> None:
        self.plan, self.book, self.types = plan, book, _TypeColumns(schema)
        self.label_of_gid, self.split_of_gid = label_of_gid, split_of_gid
        parts = [open_group(f"{plan.url}/{part_name(p)}") for p in range(book.num_partitions)]
        out = open_group(f"{plan.url}/{NODES}", mode="r+")
        sources = ["pred", "prob"] if plan.num_classes else []
        self.sources = {name: [open_array(g, name) for g in parts] for name in sources}
        self.sources |= {f"emb/{name}": [open_array(open_subgroup(g, "emb"), name) for g in parts]
                         for name in plan.names}
        self.targets = {name: open_array(out, name) for name in sources}
        self.targets |= {f"emb/{name}": open_array(open_subgroup(out, "emb"), name) for name in plan.names}
        if plan.num_classes:
            self.targets |= {name: open_array(out, name) for name in ("label", "split")}
        self.type_out = open_array(out, "node_type") if self.types.typed else None

    def write(self, start: int) -> Columns:
        """The chunk from orig id ``start``: every array's rows written; returns a node classifier's columns."""
        start, stop = self.plan.chunk(start)
        gid = self.book.gid_of_orig[start:stop]
        pieces = _pieces(self.book.bounds, gid)
        columns: Columns = {}
        for name, arrays in self.sources.items():
            target = self.targets[name]
            rows = _gather(arrays, pieces, np.empty((stop - start, *target.shape[1:]), dtype=target.dtype))
            target[start:stop] = rows
            if name in ("pred", "prob"):
                columns[name] = rows
        if self.label_of_gid is not None and self.split_of_gid is not None:
            columns["label"], columns["split"] = self.label_of_gid[gid], self.split_of_gid[gid]
            self.targets["label"][start:stop], self.targets["split"][start:stop] = columns["label"], columns["split"]
        if self.type_out is not None:
            self.type_out[start:stop] = self.types.codes(np.arange(start, stop, dtype=np.int64))
        return columns


def read_columns(plan: ExportPlan) -> Iterator[tuple[int, Columns]]:
    """A node classifier's chunks' columns read back from ``nodes.zarr`` (step 3 after units wrote them)."""
    out = open_group(f"{plan.url}/{NODES}")
    arrays = {name: open_array(out, name) for name in ("pred", "prob", "label", "split")}

    def read(start: int) -> Columns:
        lo, hi = plan.chunk(start)
        return {name: np.asarray(a[lo:hi]) for name, a in arrays.items()}

    yield from in_order(read, plan.starts)   # a few chunks read at once, handed on in order


class PredictionsTable:
    """Step 3: ``predictions.parquet``, one row group per chunk, written in orig-id order (``write``)."""

    def __init__(self, plan: ExportPlan, schema: GraphSchema) -> None:
        import fsspec
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.types, self.num_classes = pa, _TypeColumns(schema), plan.num_classes
        prob_names = [f"prob_{c}" for c in range(plan.num_classes)]
        self.schema = pa.schema([("orig_id", pa.int64()), *self.types.fields(), ("pred", pa.int64()),
                                 *[(n, pa.float32()) for n in prob_names], ("label", pa.int64()),
                                 ("split", pa.dictionary(pa.int8(), pa.string()))])
        self.split_names = pa.array(list(SPLITS), type=pa.string())
        self.files = ExitStack()   # the writer's footer first, then the file
        f = self.files.enter_context(fsspec.open(f"{plan.url}/{PREDICTIONS}", "wb"))
        # dictionary pages only for the columns of few values: on the float probabilities Parquet's default
        # dictionary attempt made the file larger (164 MB against 112 for 600 k nodes x 47 classes) and its writes
        # 7x slower (0.94 s against 0.13), before it fell back to plain pages anyway
        self.writer = self.files.enter_context(pq.ParquetWriter(f, self.schema, use_dictionary=list(FEW_VALUED)))

    def write(self, start: int, columns: Columns) -> None:
        pa = self.pa
        pred, prob, label, split = (columns[name] for name in ("pred", "prob", "label", "split"))
        split_col = pa.DictionaryArray.from_arrays(pa.array(split, mask=split < 0), self.split_names)
        orig = np.arange(start, start + pred.shape[0], dtype=np.int64)
        table = [pa.array(orig), *self.types.columns(orig), pa.array(pred),
                 *[pa.array(prob[:, c]) for c in range(self.num_classes)], pa.array(label), split_col]
        self.writer.write_table(pa.Table.from_arrays(table, schema=self.schema))

    def close(self) -> None:
        self.files.close()

    def __enter__(self) -> PredictionsTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunk_starts(plan: ExportPlan, progress: bool) -> Iterator[int]:
    from storage.progress import progress as tqdm

    yield from tqdm(plan.starts, desc="infer: export in orig-id order", unit="chunk", leave=False,
                    disable=not progress or len(plan.starts) < 4)


def node_attrs(book: PartitionBook, num_classes: int, embedding_layers: Sequence[int]) -> dict[str, Any]:
    return {"num_nodes": book.num_nodes, "num_classes": num_classes,
            "embedding_layers": sorted(int(k) for k in embedding_layers), "split_codes": SPLIT_CODES}


def link_attrs(book: PartitionBook, width: int, embedding_layers: Sequence[int]) -> dict[str, Any]:
    return {"num_nodes": book.num_nodes, "task": "link", "embedding_width": width,
            "embedding_layers": sorted(int(k) for k in embedding_layers)}


def export_orig_order(writer: StageWriter, *, book: PartitionBook, label_of_gid: np.ndarray,
                      split_of_gid: np.ndarray, num_classes: int, embedding_layers: Sequence[int],
                      schema: GraphSchema, chunk_rows: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Read the ranks' ``part-<p>.zarr`` outputs back and write ``nodes.zarr`` and ``predictions.parquet`` in orig-id
    order, a chunk of orig ids at a time on each of ``WRITE_THREADS`` threads (memory: a chunk's rows a thread,
    ``2 * WRITE_THREADS + 1`` chunks' columns, plus the book's and the labels' N-long integer
    arrays); add ``orig_id`` to each part. ``split_of_gid``: int8 ``SPLIT_CODES`` (-1: none). A typed graph's
    exports also name each node's type and its id within the type (``schema.orig_offsets()``). Returns figures."""
    names = [layer_name(layer) for layer in embedding_layers]
    plan = plan_export(writer, book=book, num_classes=num_classes, names=names, schema=schema, chunk_rows=chunk_rows,
                       attrs=node_attrs(book, num_classes, embedding_layers))
    chunks = ChunkWriter(plan, book, schema, label_of_gid, split_of_gid)
    with PredictionsTable(plan, schema) as table:
        for start, columns in in_order(chunks.write, _chunk_starts(plan, progress)):
            table.write(start, columns)
    return {"export_chunk_rows": plan.rows, "exported_nodes": plan.num_nodes}


def export_link_embeddings(writer: StageWriter, *, book: PartitionBook, embedding_layers: Sequence[int],
                           schema: GraphSchema, chunk_rows: int | None = None, progress: bool = False
                           ) -> dict[str, Any]:
    """A link model's ``nodes.zarr`` in orig-id order: ``emb/out`` and the stored hidden layers (typed: and
    ``node_type``), a chunk of orig ids at a time; adds ``orig_id`` to each part. Returns figures."""
    plan = plan_link_export(writer, book=book, embedding_layers=embedding_layers, schema=schema,
                            chunk_rows=chunk_rows)
    chunks = ChunkWriter(plan, book, schema)
    for _ in in_order(chunks.write, _chunk_starts(plan, progress)):
        pass
    return {"export_chunk_rows": plan.rows, "exported_nodes": plan.num_nodes}


def plan_link_export(writer: StageWriter, *, book: PartitionBook, embedding_layers: Sequence[int],
                     schema: GraphSchema, chunk_rows: int | None = None) -> ExportPlan:
    """``plan_export`` of a link model's outputs: ``emb/out`` and the stored hidden layers."""
    names = [OUT, *(layer_name(layer) for layer in embedding_layers)]
    width = int(open_array(open_subgroup(open_group(writer.file_url(part_name(0))), "emb"), OUT).shape[1])
    return plan_export(writer, book=book, num_classes=0, names=names, schema=schema, chunk_rows=chunk_rows,
                       attrs=link_attrs(book, width, embedding_layers))


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

    def codes(self, orig: np.ndarray) -> np.ndarray:
        """The node types of the orig ids ``orig``."""
        return (np.searchsorted(self.offsets, orig, side="right") - 1).astype(np.int8)

    def columns(self, orig: np.ndarray) -> list[Any]:
        """The Parquet columns of the chunk of orig ids ``orig``."""
        import pyarrow as pa

        if not self.typed:
            return []
        code = self.codes(orig)
        names = pa.array(self.names, type=pa.string())
        return [pa.DictionaryArray.from_arrays(pa.array(code), names), pa.array(orig - self.offsets[code])]
