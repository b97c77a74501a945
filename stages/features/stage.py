"""Features stage: graph.zarr + partition book → one Zarr v3 store per partition: x per node type, y, split lids.

Contract: download + partition manifests + params → artifact ``features/<key>/part-<p>.zarr`` (format in
``storage.features``), x streamed in row chunks under ``memory_budget_bytes`` (``stages.features.stream``). Row
chunks with no compressor and a crc32c codec: chosen by measurement
(benchmarks/bench_features.py, figures in benchmarks/RESULTS.md). ``x`` is stored in the dtype ``dtype`` picks
(``stages.features.dtypes``: float64 and wide integers as float32, float16 and 1-byte bool/int kept), or coded
as bfloat16, int8 or float8 e4m3 with per-column scales fitted over the whole x of each type
(``stages.features.schemes``); the manifest records each type's scheme, the stores hold its per-column arrays.
The stores are written by units (``stages.features.units``: a group of parts each) on the ``executor``
(``stages.executor``: this process, or a Dask cluster), byte-identical whichever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from stages.choices import Compressor, FeatureDtype, FeatureNorm
from stages.executor import open_executor, part_groups, unit_record
from stages.memory import MemoryBudget
from stages.meter import anon_rss_bytes, measure
from stages.params import BudgetedParams
from storage import ArtifactStore, Manifest, StageWriter
from storage.graph import GraphArtifact
from storage.partition import PartitionArtifact
from storage.report import Report, markdown_table
from storage.summaries import FeaturesSummary

if TYPE_CHECKING:
    from stages.runtime.feature_codec import FeatureCodec

NAME = "features"
VERSION = 3   # 2: float64 and wide integer x are stored as float32, float16 and 1-byte types kept (features.dtype);
#   rows l1-normalised on request (features.normalize); 3: one x per featured node type, rows by tlid
UPSTREAM = ("download", "partition")


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


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    # imported here, not above: the coding of rows needs torch, and every `gnnpipe` command (help, status, an error
    # line) imports this module for its Params: torch took 1.0 of `gnnpipe --help`'s 2.2 s (tests/test_cli.py)
    from stages.features import stream
    from stages.features.schemes import fit_codec_blocks
    from stages.features.units import Layout, PartsJob, make_plan, write_parts

    download, partition = upstream["download"], upstream["partition"]
    graph, parts = GraphArtifact(store, download), PartitionArtifact(store, partition)
    budget = MemoryBudget.resolve(params.memory_budget_bytes, NAME)
    layout = Layout(params.chunk_rows, params.compressor, params.dtype, params.normalize)
    plan = make_plan(graph, parts, layout)
    # a cached build is returned whatever the budget and executor (runtime settings, not in the key)
    if not force and (cached := store.cached(NAME, VERSION, params.key_params(), upstream)) is not None:
        return cached
    with open_executor(params.executor, units=parts.num_partitions, store=store) as executor:
        share = budget.share(executor.slots, plan.minimum(), "the partition book, y, the splits and one output "
                                                             "chunk per part")

        def body(writer: StageWriter) -> None:
            start_anon = anon_rss_bytes()
            with measure() as cost:
                # x is streamed (stages.features.stream): one code path whatever the budget. Holding x whole was no
                # faster at 1 M nodes x 128 float32 (5.7-5.9 s against 5.0-5.5 s streamed, peak anonymous memory
                # 1.26 GB against 0.59 GB); int8 pays a second read of x to fit (7.5 s against 6.1 s), the price
                # of a bound that does not grow with N (docs/history.md, "Features under the memory budget")
                rows = {t.name: stream.stream_rows(t, share, plan.fixed_bytes()) for t in plan.types}
                codecs = {t.name: fit_codec_blocks(t.source.dtype, t.num_columns,
                                                   (b for _, b in stream.row_chunks(t.source, rows[t.name])),
                                                   params.dtype, params.normalize) for t in plan.types}
                schemes = {name: codec.scheme_record() for name, codec in codecs.items()}
                jobs = [PartsJob(store.root, download, partition, writer.work_dir(), group, layout, schemes, rows,
                                 progress=progress and executor.slots == 1)
                        for group in part_groups(parts.num_partitions, executor.slots)]
                units = executor.map(write_parts, jobs, name="features-unit")
            per_type = {t.name: {"num_features": t.num_columns, "source_dtype": t.source.dtype.name,
                                 **_scheme_summary(codecs[t.name]), "stream_rows": rows[t.name],
                                 "bytes_features": codecs[t.name].itemsize * t.num_columns * t.num_rows}
                        for t in plan.types}
            writer.summary.update({
                "num_partitions": parts.num_partitions, "num_classes": plan.num_classes, "types": per_type,
                "normalize": params.normalize, "compressor": params.compressor or "none",
                "parts": sorted((part for unit in units for part in unit["parts"]), key=lambda r: r["part"]),
                "memory_budget_bytes": budget.bytes, "memory_budget_source": budget.source,
                "memory_minimum_bytes": plan.minimum(), "start_anon_bytes": start_anon,
                **_headline_figures(per_type), **_with_units(cost, units, executor.slots)})

        return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


def _with_units(cost: dict[str, Any], units: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """The stage's own figures; on Dask also each unit's (a worker's peak memory is not this process's) and the
    host and pid of the worker that ran it."""
    if slots == 1:   # the one unit ran in this process: its peak is within the stage's
        return cost
    return {**cost, "executor_slots": slots,
            "units": [unit_record([r["part"] for r in u["parts"]], u) for u in units]}


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
    s = FeaturesSummary.from_json(manifest.summary)
    rows = [dict(r) for r in s.parts]
    codec = "crc32c" if s.compressor == "none" else f"{s.compressor}+crc32c"
    source = s.source   # artifacts written before the dtype parameter: the stored dtype
    stored = s.feature_dtype if source == s.feature_dtype else f"{s.feature_dtype} (from {source})"
    norm = f", rows {s.normalize}-normalised" if s.normalize != "none" else ""
    headline = (f"{s.num_partitions} feature stores, {s.num_features} × {stored}{norm}, "
                f"chunks of ≤ {max(r['chunk_rows'] for r in s.parts)} rows, codec {codec}, "
                f"{manifest.bytes / 2**20:.1f} MiB, {s.wall_s:.1f} s")
    md = f"## features `{manifest.key}`\n\n{headline}\n\n{markdown_table(rows)}\n"
    return Report(headline, rows, md)
