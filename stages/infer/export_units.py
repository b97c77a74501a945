"""The infer stage's exports on an executor (``stages.executor``): units that each write a range of whole export
chunks of ``nodes.zarr`` (``storage.infer_export``).

``local`` writes the exports in this process as before executors (``export_orig_order`` /
``export_link_embeddings``: a chunk's rows gathered from the ranks' parts, written to ``nodes.zarr``, and its
Parquet row group, a few chunks at once on threads, in order). On Dask the stage writes what precedes the
chunks (each part's ``orig_id``, ``nodes.zarr``'s arrays and attrs: ``plan_export``), the units write the chunks,
one at a time, one contiguous range of chunk indices per worker slot (every array is chunked by the export's
rows, so two units never write one Zarr chunk), and the stage then writes ``predictions.parquet`` from
``nodes.zarr`` read back in the same chunks (a few at once): the same arrays, hence the same bytes.

A unit (:func:`write_chunks` of an :class:`ExportJob`) is handed URLs and manifests only: it reads the partition
book, and a node classifier's labels and splits from the features' stores (O(N) integers, as the stage holds),
then gathers its chunks from the parts. A unit run again rewrites its chunks with the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.executor import open_executor, part_groups
from stages.meter import measure
from storage import ArtifactStore, Manifest, StageWriter
from storage.features import FeaturesArtifact
from storage.graph import SPLITS
from storage.infer import SPLIT_CODES
from storage.infer_export import (
    ChunkWriter,
    ExportPlan,
    PredictionsTable,
    layer_name,
    node_attrs,
    plan_export,
    plan_link_export,
    read_columns,
)
from storage.partition import PartitionArtifact


@dataclass(frozen=True)
class ExportJob:
    """One unit: export chunks ``chunks`` (indices into ``plan.starts``) of ``plan``; ``features``: a node
    classifier's features manifest (its labels and splits), None for a link model."""

    root: str
    partition: Manifest
    features: Manifest | None
    plan: ExportPlan
    chunks: tuple[int, ...]

    @property
    def label(self) -> str:
        """The unit's name in Prefect's task runs: its chunks."""
        first, last = self.chunks[0], self.chunks[-1]
        return f"chunks-{first}-{last}" if last > first else f"chunk-{first}"


def write_chunks(job: ExportJob) -> dict[str, Any]:
    """The unit: its chunks of ``nodes.zarr`` written; returns them and its wall time and peak memory."""
    store = ArtifactStore(job.root)
    with measure() as cost:
        parts = PartitionArtifact(store, job.partition)
        book = parts.book()
        labels = (None, None) if job.features is None else labels_and_splits(FeaturesArtifact(store, job.features),
                                                                              book.num_partitions)
        writer = ChunkWriter(job.plan, book, parts.schema, *labels)
        for c in job.chunks:   # one at a time: the units themselves are the parallel writers (a process a slot)
            writer.write(job.plan.starts[c])
    return {"chunks": list(job.chunks), "wall_s": cost["wall_s"], "peak_rss_bytes": cost["peak_rss_bytes"]}


def labels_and_splits(features: FeaturesArtifact, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Every gid's label and split code (``storage.infer.SPLIT_CODES``, -1 for none), from the partitions' stores
    (their labels and split lids; ``x`` is not read)."""
    labels, splits = [], []
    for p in range(num_partitions):
        part = features.part(p, load_x=False)
        code = np.full(part.y.shape[0], -1, dtype=np.int8)
        for split in SPLITS:
            code[part.split_lids[split]] = SPLIT_CODES[split]
        labels.append(part.y.astype(np.int64, copy=False))
        splits.append(code)
    return np.concatenate(labels), np.concatenate(splits)


def export_on(executor_text: str, store: ArtifactStore, writer: StageWriter, *, partition: Manifest,
              features: Manifest | None, num_classes: int, embedding_layers: list[int]) -> dict[str, Any]:
    """The exports with their chunks written by units on the executor ``executor_text`` (not ``local``);
    ``features`` None: a link model's. Returns the figures ``export_orig_order`` returns, and the units'."""
    parts = PartitionArtifact(store, partition)
    book, schema = parts.book(), parts.schema
    if features is None:
        plan = plan_link_export(writer, book=book, embedding_layers=embedding_layers, schema=schema)
    else:
        plan = plan_export(writer, book=book, num_classes=num_classes, schema=schema,
                           names=[layer_name(layer) for layer in embedding_layers],
                           attrs=node_attrs(book, num_classes, embedding_layers))
    del book
    num_chunks = len(plan.starts)
    with open_executor(executor_text, units=num_chunks, store=store) as executor:
        jobs = [ExportJob(store.root, partition, features, plan, group)
                for group in part_groups(num_chunks, executor.slots) if group]
        units = executor.map(write_chunks, jobs, name="infer-export")
    if features is not None:
        with PredictionsTable(plan, schema) as table:
            for start, columns in read_columns(plan):
                table.write(start, columns)
    return {"export_chunk_rows": plan.rows, "exported_nodes": plan.num_nodes,
            "export_executor_slots": executor.slots, "export_units": units}
