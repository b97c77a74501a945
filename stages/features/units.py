"""The features stage's parallel unit: write the stores of a group of parts, wherever ``stages.executor`` runs it.

A unit is :func:`write_parts` of a :class:`PartsJob`: small values only (the root's URL, the two upstream manifests,
the build's work directory, the codecs' per-column scales), so a Dask worker on another host reads its inputs
from the store and writes its parts' Zarr stores there itself; it returns each part's figures and its own time
and memory. Each part's store is written by exactly one unit, chunk by chunk in row order as the one-process stage
wrote it, so the artifact is byte-identical however parts are grouped (tests/test_executor.py).

Why groups of parts and not one unit per part: a unit streams every row of x to find its parts' rows (a part's
rows are spread over the whole id range), so each unit reads x once. ``local`` runs one unit with every part (x
read once, as before executors); on Dask there is one unit per worker slot (``executor.part_groups``), x read
once per worker. Each unit holds the stage's fixed O(N) arrays (the book, y, the splits) and its stream chunk within its
share of the budget (``memory_budget_bytes`` / slots).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.choices import Compressor, FeatureDtype, FeatureNorm
from stages.features import stream
from stages.features.schemes import storage_of
from stages.meter import anon_rss_bytes, measure
from stages.runtime.feature_codec import FeatureCodec
from storage import ArtifactStore, Manifest
from storage.features import FeatureScheme, PartFeaturesWriter
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact
from storage.writer import WorkDir
from storage.zarr_io import chunk_rows_for

# ~16 MiB chunks within [8 192, 65 536] rows: the fastest whole loads measured (benchmarks/RESULTS.md, "Chunk
# shape and codec"); storage's 64 MiB default suits the download stage's sequentially read arrays.
DEFAULT_CHUNK_BYTES = 16 << 20
MAX_CHUNK_ROWS = 65536


def default_chunk_rows(num_rows: int, row_bytes: int) -> int:
    """~16 MiB chunks within [8 192, 65 536] rows, evened out so the last chunk is not mostly padding
    (Zarr stores edge chunks at full size)."""
    return chunk_rows_for(num_rows, row_bytes, DEFAULT_CHUNK_BYTES, max_rows=MAX_CHUNK_ROWS, even=True)


def split_lids_of(splits_orig: dict[str, np.ndarray], gid_of_orig: np.ndarray, lo: int, hi: int
                  ) -> dict[str, np.ndarray]:
    """Each split's nodes owned by gid range [lo, hi), as sorted lids."""
    out = {}
    for name in SPLITS:
        split_gid = gid_of_orig[splits_orig[name]]
        owned_gid = split_gid[(split_gid >= lo) & (split_gid < hi)]
        out[name] = np.sort(owned_gid - lo)
    return out


@dataclass(frozen=True)
class Layout:
    """The Params that decide what the stores hold (all of them key fields)."""

    chunk_rows: int | None
    compressor: Compressor | None
    dtype: FeatureDtype
    normalize: FeatureNorm


@dataclass(frozen=True)
class Plan:
    """What the stage will hold, known from the manifests, the book's type ranges and x's metadata alone."""

    types: list[stream.TypeStream]
    num_nodes: int
    num_split_nodes: int
    num_classes: int

    def fixed_bytes(self) -> int:
        return stream.fixed_bytes(self.num_nodes, self.num_split_nodes)

    def minimum(self) -> int:
        """What one unit needs at least (with every part's output chunk: a unit may hold all parts)."""
        return self.fixed_bytes() + max((t.floor_bytes() for t in self.types), default=0)


def make_plan(graph: GraphArtifact, parts: PartitionArtifact, layout: Layout) -> Plan:
    schema, table = graph.schema, parts.range_table()
    offsets = schema.orig_offsets()
    num_parts = parts.num_partitions
    types = []
    for index, node_type in enumerate(schema.node_types):
        if node_type.num_features is None:
            continue
        source = graph.x_array(node_type.name)
        itemsize = storage_of(source.dtype, layout.dtype, layout.normalize).itemsize
        ranges = [table.type_range(p, index) for p in range(num_parts)]
        part_rows = [int(hi - lo) for lo, hi in ranges]
        chunks = [layout.chunk_rows or default_chunk_rows(n, itemsize * int(source.shape[1])) for n in part_rows]
        types.append(stream.TypeStream(node_type.name, index, int(offsets[index]), source, itemsize, chunks,
                                       part_rows))
    return Plan(types, graph.num_nodes, sum(int(v) for v in graph.summary.split_sizes.values()),
                max((t.num_classes for t in schema.node_types), default=0))


@dataclass(frozen=True)
class PartsJob:
    """One unit: write the stores of ``parts`` into ``out``. ``rows``: stream chunk rows of each type (from the
    unit's budget share); ``schemes``: each type's codec (per-column float32 scales, F values each)."""

    root: str
    download: Manifest
    partition: Manifest
    out: WorkDir
    parts: tuple[int, ...]
    layout: Layout
    schemes: dict[str, FeatureScheme]
    rows: dict[str, int]
    progress: bool = False

    @property
    def label(self) -> str:
        """The unit's name in Prefect's task runs: its parts."""
        return f"parts-{self.parts[0]}-{self.parts[-1]}" if len(self.parts) > 1 else f"part-{self.parts[0]}"


def write_parts(job: PartsJob) -> dict[str, Any]:
    """The unit: every type's rows of ``job.parts`` streamed into their stores, then y, the splits and attrs.
    Returns each part's figures (``parts``), the unit's wall time and peak memory, and where it ran (``host``,
    ``pid``: which worker of a cluster wrote which parts)."""
    store = ArtifactStore(job.root)
    graph, artifact = GraphArtifact(store, job.download), PartitionArtifact(store, job.partition)
    start_anon = anon_rss_bytes()
    with measure() as cost:
        plan = make_plan(graph, artifact, job.layout)
        book = artifact.book()
        y, splits = graph.labels()
        writers = {p: PartFeaturesWriter(
            job.out, part=p, start_gid=int(book.bounds[p]),
            shapes={t.name: (t.part_rows[p], t.num_columns) for t in plan.types},
            chunk_rows={t.name: t.chunk_rows[p] for t in plan.types}, schemes=job.schemes,
            compressor=job.layout.compressor) for p in job.parts}
        table = book.range_table()
        codecs = {name: FeatureCodec.of(scheme) for name, scheme in job.schemes.items()}
        for t in plan.types:
            starts = [table.type_range(p, t.index)[0] for p in range(book.num_partitions)]
            stream.stream_type(t, codecs[t.name], job.rows[t.name], book, starts, writers, job.layout.normalize,
                               progress=job.progress)
        per_part = []
        for p, out in writers.items():
            lo, hi = int(book.bounds[p]), int(book.bounds[p + 1])
            attrs = out.finish(y=y[book.orig_of_gid[lo:hi]], split_lids=split_lids_of(splits, book.gid_of_orig, lo, hi),
                               num_classes=plan.num_classes)
            per_part.append({"part": p, "rows": attrs["num_nodes"],
                             "chunk_rows": max((t.chunk_rows[p] for t in plan.types), default=0),
                             **attrs["split_sizes"]})
    return {"parts": per_part, "start_anon_bytes": start_anon, "host": socket.gethostname(), "pid": os.getpid(),
            **cost}
