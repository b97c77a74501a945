"""Features stage: graph.zarr + partition book → one Zarr v3 store per partition: x per node type, y, split lids.

Contract: download + partition manifests + params → artifact ``features/<key>/part-<p>.zarr`` (format in
``storage.features``). Row chunks with no compressor and a crc32c codec: chosen by measurement
(benchmarks/bench_features.py, figures in benchmarks/RESULTS.md). ``x`` is stored in the dtype ``dtype`` picks
(``stages.features.dtypes``: float64 and wide integers as float32, float16 and 1-byte bool/int kept), or coded
as bfloat16, int8 or float8 e4m3 with per-column scales fitted over the whole x of each type
(``stages.features.schemes``); the manifest records each type's scheme, the stores hold its per-column arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from stages.choices import Compressor, FeatureDtype, FeatureNorm
from stages.features.normalize import normalize_rows
from stages.features.schemes import encode_rows, fit_codec
from stages.meter import measure
from stages.params import BudgetedParams
from stages.runtime.feature_codec import FeatureCodec
from storage import ArtifactStore, Manifest, StageWriter
from storage.features import write_part_features
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact
from storage.progress import progress as tqdm
from storage.report import Report, markdown_table
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

    def body(writer: StageWriter) -> None:
        per_part: list[dict[str, Any]] = []
        with measure() as cost:
            # Rows are gathered per partition from the whole x held once in RAM: one sequential read beats
            # P scattered passes over the chunked source. Edge features live with the partition, not here.
            graph = GraphArtifact(store, download).read(edges=False)
            book = PartitionArtifact(store, partition).book()
            table, offsets = book.range_table(), graph.schema.orig_offsets()
            types = {t.name: i for i, t in enumerate(graph.schema.node_types)}
            codecs = {name: fit_codec(x, params.dtype, params.normalize) for name, x in graph.features.items()}
            schemes = {name: codec.scheme_record() for name, codec in codecs.items()}
            parts = range(book.num_partitions)
            for p in tqdm(parts, desc="features: write parts", disable=not progress, leave=False):
                lo, hi = int(book.bounds[p]), int(book.bounds[p + 1])
                rows, chunks = {}, {}
                for name, x_orig in graph.features.items():
                    t_lo, t_hi = table.type_range(p, types[name])
                    type_orig = book.orig_of_gid[t_lo:t_hi] - offsets[types[name]]   # the type's own ids
                    chunks[name] = params.chunk_rows or default_chunk_rows(t_hi - t_lo,
                                                                           codecs[name].itemsize * x_orig.shape[1])
                    rows[name] = encode_rows(normalize_rows(x_orig[type_orig], params.normalize), codecs[name],
                                             type_orig)
                attrs = write_part_features(
                    writer, part=p, start_gid=lo, features=rows, y=graph.y[book.orig_of_gid[lo:hi]],
                    split_lids=split_lids_of(graph.splits, book.gid_of_orig, lo, hi),
                    num_classes=graph.num_classes, chunk_rows=chunks, schemes=schemes,
                    compressor=params.compressor, progress=progress)
                per_part.append({"part": p, "rows": attrs["num_nodes"],
                                 "chunk_rows": max(chunks.values(), default=0), **attrs["split_sizes"]})
        per_type = {name: {"num_features": int(x.shape[1]), "source_dtype": x.dtype.name,
                           **_scheme_summary(codecs[name]),
                           "bytes_features": codecs[name].itemsize * int(x.shape[1]) * int(x.shape[0])}
                    for name, x in graph.features.items()}
        writer.summary.update({
            "num_partitions": book.num_partitions, "num_classes": graph.num_classes, "types": per_type,
            "normalize": params.normalize, "compressor": params.compressor or "none", "parts": per_part,
            **_headline_figures(per_type), **cost})

    return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


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
