"""Features stage: graph.zarr + partition book → one Zarr v3 store of x, y, split lids per partition.

Contract: download + partition manifests + params → artifact ``features/<key>/part-<p>.zarr`` (format in
``storage.features``). Row chunks with no compressor and a crc32c codec: chosen by measurement
(benchmarks/bench_features.py, figures in benchmarks/RESULTS.md).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from storage.progress import progress as tqdm

from storage import ArtifactStore, Manifest, StageWriter
from storage.features import part_store, write_part_features
from storage.graph import GROUP, SPLITS, read_graph
from storage.partition import BOOK, read_book
from storage.report import Report, markdown_table
from stages.meter import measure

NAME = "features"
VERSION = 1
UPSTREAM = ("download", "partition")
DEFAULT_CHUNK_BYTES = 16 << 20


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def key_params(self) -> dict[str, Any]:
        return self.model_dump()

    chunk_rows: int | None = Field(None, ge=1)  # None: ~16 MiB per chunk, clamped to [8 192, 65 536] rows
    compressor: Literal["lz4", "zstd"] | None = None


def default_chunk_rows(num_rows: int, row_bytes: int) -> int:
    """~16 MiB chunks within [8 192, 65 536] rows, evened out so the last chunk is not mostly padding
    (Zarr stores edge chunks at full size)."""
    target = int(np.clip(DEFAULT_CHUNK_BYTES // max(row_bytes, 1), 8192, 65536))
    num_chunks = max(1, -(-num_rows // target))
    return max(1, -(-num_rows // num_chunks))


def split_lids_of(splits_orig: dict[str, np.ndarray], gid_of_orig: np.ndarray, lo: int, hi: int
                  ) -> dict[str, np.ndarray]:
    """Each split's nodes owned by gid range [lo, hi), as sorted lids."""
    out = {}
    for name in SPLITS:
        split_gid = gid_of_orig[splits_orig[name]]
        owned_gid = split_gid[(split_gid >= lo) & (split_gid < hi)]
        out[name] = np.sort(owned_gid - lo)
    return out


def run(store: ArtifactStore, params: Params, upstream: dict[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    download, partition = upstream["download"], upstream["partition"]

    def body(writer: StageWriter) -> None:
        per_part: list[dict[str, Any]] = []
        with measure() as cost:
            # Rows are gathered per partition from the whole x held once in RAM: one sequential read beats
            # P scattered passes over the chunked source.
            graph = read_graph(store.url("download", download["key"], GROUP))
            book = read_book(store.url("partition", partition["key"], BOOK))
            x_orig = graph.x
            assert x_orig is not None
            row_bytes = x_orig.dtype.itemsize * x_orig.shape[1]
            parts = range(book.num_partitions)
            for p in tqdm(parts, desc="features: write parts", disable=not progress, leave=False):
                lo, hi = int(book.bounds[p]), int(book.bounds[p + 1])
                orig_ids = book.orig_of_gid[lo:hi]
                chunk_rows = params.chunk_rows or default_chunk_rows(hi - lo, row_bytes)
                attrs = write_part_features(
                    writer.file_url(part_store(p)), part=p, start_gid=lo, x=x_orig[orig_ids], y=graph.y[orig_ids],
                    split_lids=split_lids_of(graph.splits, book.gid_of_orig, lo, hi),
                    num_classes=graph.num_classes, chunk_rows=chunk_rows, compressor=params.compressor,
                    progress=progress)
                per_part.append({"part": p, "rows": attrs["num_nodes"], "chunk_rows": chunk_rows,
                                 **attrs["split_sizes"]})
        writer.summary.update({
            "num_partitions": book.num_partitions, "num_features": int(x_orig.shape[1]),
            "feature_dtype": str(x_orig.dtype), "num_classes": graph.num_classes,
            "compressor": params.compressor or "none", "parts": per_part,
            "bytes_features": int(x_orig.nbytes), **cost})

    return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


def report(manifest: Manifest) -> Report:
    s = manifest["summary"]
    rows = [dict(r) for r in s["parts"]]
    codec = "crc32c" if s["compressor"] == "none" else f"{s['compressor']}+crc32c"
    headline = (f"{s['num_partitions']} feature stores, {s['num_features']} × {s['feature_dtype']}, "
                f"chunks of ≤ {max(r['chunk_rows'] for r in s['parts'])} rows, codec {codec}, "
                f"{manifest['bytes'] / 2**20:.1f} MiB, {s['wall_s']:.1f} s")
    md = f"## features `{manifest['key']}`\n\n{headline}\n\n{markdown_table(rows)}\n"
    return Report(headline, rows, md)
