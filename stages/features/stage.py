"""Features stage: graph.zarr + partition book → one Zarr v3 store per partition: x per node type, y, split lids.

Contract: download + partition manifests + params → artifact ``features/<key>/part-<p>.zarr`` (format in
``storage.features``), x streamed in row chunks under ``memory_budget_bytes`` (``stages.features.stream``). Row
chunks with no compressor and a crc32c codec: chosen by measurement
(benchmarks/bench_features.py, figures in benchmarks/RESULTS.md). ``x`` is stored in the dtype ``dtype`` picks
(``stages.features.dtypes``: float64 and wide integers as float32, float16 and 1-byte bool/int kept), or coded
as bfloat16, int8 or float8 e4m3 with per-column scales fitted over the whole x of each type
(``stages.features.schemes``); the manifest records each type's scheme, the stores hold its per-column arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from stages.choices import Compressor, FeatureDtype, FeatureNorm
from stages.features import stream
from stages.features.schemes import fit_codec_blocks, storage_of
from stages.memory import MemoryBudget
from stages.meter import anon_rss_bytes, measure
from stages.params import BudgetedParams
from stages.runtime.feature_codec import FeatureCodec
from storage import ArtifactStore, Manifest, StageWriter
from storage.features import PartFeaturesWriter
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact
from storage.progress import progress as tqdm
from storage.report import Report, markdown_table
from storage.store import stage_key
from storage.zarr_io import chunk_rows_for

NAME = "features"
VERSION = 3   # 2: float64 and wide integer x are stored as float32, float16 and 1-byte types kept (features.dtype);
#   rows l1-normalised on request (features.normalize); 3: one x per featured node type, rows by tlid
UPSTREAM = ("download", "partition")
# ~16 MiB chunks within [8 192, 65 536] rows: the fastest whole loads measured (benchmarks/RESULTS.md, "Chunk
# shape and codec"); storage's 64 MiB default suits the download stage's sequentially read arrays.
DEFAULT_CHUNK_BYTES = 16 << 20
MAX_CHUNK_ROWS = 65536


class Params(BudgetedParams):
    chunk_rows: int | None = Field(None, ge=1, description="rows per Zarr chunk; null: ~16 MiB chunks within "
                                                            "[8 192, 65 536] rows")
    compressor: Compressor | None = Field(None, description="Blosc codec for x; null: none (dense floats "
                                                            "compress ~1.1x, see benchmarks/RESULTS.md)")
    dtype: FeatureDtype = Field("auto", description="stored dtype of x; auto: float32, but float16, bool, int8 and "
                                                    "uint8 are kept; int8 and float8_e4m3 quantise each column "
                                                    "(scale, and offset for int8); rows reach the model as "
                                                    "float32")
    normalize: FeatureNorm = Field("none", description="l1: divide each row of x by the sum of its absolute values "
                                                       "(GCN's preprocessing of bag-of-words rows; stored as float32 "
                                                       "under dtype auto); none: x as given")


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


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    download, partition = upstream["download"], upstream["partition"]
    graph, parts = GraphArtifact(store, download), PartitionArtifact(store, partition)
    budget = MemoryBudget.resolve(params.memory_budget_bytes, NAME)
    plan = _plan(graph, parts, params)
    key = stage_key(NAME, VERSION, params.key_params(), {n: m.key for n, m in upstream.items()})
    if force or store.find(NAME, key) is None:   # a cached artifact is returned whatever the budget
        budget.require(plan.minimum(), "the partition book, y, the splits and one output chunk per part")

    def body(writer: StageWriter) -> None:
        start_anon = anon_rss_bytes()
        with measure() as cost:
            # x is streamed (stages.features.stream): one code path whatever the budget. Holding x whole was no
            # faster at 1 M nodes x 128 float32 (5.7-5.9 s against 5.0-5.5 s streamed, peak anonymous memory 1.26 GB
            # against 0.59 GB); int8 pays a second read of x to fit (7.5 s against 6.1 s), the price of a bound
            # that does not grow with N (docs/design.md, "Features under the memory budget")
            book = parts.book()
            y, splits = graph.labels()
            fixed = stream.fixed_bytes(book.num_nodes, sum(int(s.shape[0]) for s in splits.values()))
            rows = {t.name: stream.stream_rows(t, budget, fixed) for t in plan.types}
            codecs = {t.name: fit_codec_blocks(t.source.dtype, t.num_columns,
                                               (b for _, b in stream.row_chunks(t.source, rows[t.name])),
                                               params.dtype, params.normalize) for t in plan.types}
            writers = [PartFeaturesWriter(
                writer, part=p, start_gid=int(book.bounds[p]),
                shapes={t.name: (t.part_rows[p], t.num_columns) for t in plan.types},
                chunk_rows={t.name: t.chunk_rows[p] for t in plan.types},
                schemes={name: codec.scheme_record() for name, codec in codecs.items()},
                compressor=params.compressor) for p in range(book.num_partitions)]
            table = book.range_table()
            for t in plan.types:
                starts = [table.type_range(p, t.index)[0] for p in range(book.num_partitions)]
                stream.stream_type(t, codecs[t.name], rows[t.name], book, starts, writers, params.normalize,
                                   progress=progress)
            per_part: list[dict[str, Any]] = []
            for p, out in enumerate(tqdm(writers, desc="features: finish parts", disable=not progress,
                                         leave=False)):
                lo, hi = int(book.bounds[p]), int(book.bounds[p + 1])
                attrs = out.finish(y=y[book.orig_of_gid[lo:hi]],
                                   split_lids=split_lids_of(splits, book.gid_of_orig, lo, hi),
                                   num_classes=plan.num_classes)
                per_part.append({"part": p, "rows": attrs["num_nodes"],
                                 "chunk_rows": max((t.chunk_rows[p] for t in plan.types), default=0),
                                 **attrs["split_sizes"]})
        per_type = {t.name: {"num_features": t.num_columns, "source_dtype": t.source.dtype.name,
                             **_scheme_summary(codecs[t.name]), "stream_rows": rows[t.name],
                             "bytes_features": codecs[t.name].itemsize * t.num_columns * t.num_rows}
                    for t in plan.types}
        writer.summary.update({
            "num_partitions": book.num_partitions, "num_classes": plan.num_classes, "types": per_type,
            "normalize": params.normalize, "compressor": params.compressor or "none", "parts": per_part,
            "memory_budget_bytes": budget.bytes, "memory_budget_source": budget.source,
            "memory_minimum_bytes": plan.minimum(), "start_anon_bytes": start_anon,
            **_headline_figures(per_type), **cost})

    return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


@dataclass(frozen=True)
class _Plan:
    """What the stage will hold, known from the manifests, the book's type ranges and x's metadata alone."""

    types: list[stream.TypeStream]
    num_nodes: int
    num_split_nodes: int
    num_classes: int

    def minimum(self) -> int:
        return (stream.fixed_bytes(self.num_nodes, self.num_split_nodes)
                + max((t.floor_bytes() for t in self.types), default=0))


def _plan(graph: GraphArtifact, parts: PartitionArtifact, params: Params) -> _Plan:
    schema, table = graph.schema, parts.range_table()
    offsets = schema.orig_offsets()
    num_parts = parts.num_partitions
    types = []
    for index, node_type in enumerate(schema.node_types):
        if node_type.num_features is None:
            continue
        source = graph.x_array(node_type.name)
        itemsize = storage_of(source.dtype, params.dtype, params.normalize).itemsize
        ranges = [table.type_range(p, index) for p in range(num_parts)]
        part_rows = [int(hi - lo) for lo, hi in ranges]
        chunks = [params.chunk_rows or default_chunk_rows(n, itemsize * int(source.shape[1])) for n in part_rows]
        types.append(stream.TypeStream(node_type.name, index, int(offsets[index]), source, itemsize, chunks,
                                       part_rows))
    split_sizes = graph.manifest.summary.get("split_sizes", {})
    return _Plan(types, graph.num_nodes, sum(int(v) for v in split_sizes.values()),
                 max((t.num_classes for t in schema.node_types), default=0))


def _scheme_summary(codec: FeatureCodec) -> dict[str, Any]:
    """A type's coding for the manifest: the scheme and storage dtype, and the spread of its per-column scales
    (the arrays themselves are in every partition's store, ``storage.features``)."""
    out: dict[str, Any] = {"feature_dtype": codec.scheme_record().storage_dtype, "scheme": codec.scheme}
    if codec.scale is not None:
        out["scale_range"] = [float(codec.scale.min()), float(codec.scale.max())] if codec.scale.numel() else []
    return out


def _headline_figures(per_type: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report's headline figures: the featured type's, or the sums (and the dtypes) over several."""
    return {"num_features": sum(t["num_features"] for t in per_type.values()),
            "feature_dtype": ",".join(sorted({t["feature_dtype"] for t in per_type.values()})),
            "source_dtype": ",".join(sorted({t["source_dtype"] for t in per_type.values()})),
            "bytes_features": sum(t["bytes_features"] for t in per_type.values())}


def report(manifest: Manifest) -> Report:
    s = manifest.summary
    rows = [dict(r) for r in s["parts"]]
    codec = "crc32c" if s["compressor"] == "none" else f"{s['compressor']}+crc32c"
    source = s.get("source_dtype", s["feature_dtype"])   # artifacts written before the dtype parameter lack it
    stored = s["feature_dtype"] if source == s["feature_dtype"] else f"{s['feature_dtype']} (from {source})"
    norm = f", rows {s['normalize']}-normalised" if s.get("normalize", "none") != "none" else ""
    headline = (f"{s['num_partitions']} feature stores, {s['num_features']} × {stored}{norm}, "
                f"chunks of ≤ {max(r['chunk_rows'] for r in s['parts'])} rows, codec {codec}, "
                f"{manifest.bytes / 2**20:.1f} MiB, {s['wall_s']:.1f} s")
    md = f"## features `{manifest.key}`\n\n{headline}\n\n{markdown_table(rows)}\n"
    return Report(headline, rows, md)
