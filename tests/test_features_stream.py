"""The features stage streams x under its memory budget (``stages.features.stream``): the stores it writes are
byte-identical to gathering every part's rows from the whole x in memory (the stage's path before [2/5], kept here
as the reference), for homogeneous and typed graphs, every dtype scheme, l1 rows and any stored source dtype; the
chunked codec fit gives exactly the in-memory scales and offsets; a budget below the stage's minimum fails in one
line before anything is written. Tiny stream chunks (a few rows) and output chunks (7 rows) make every part take
several of each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flows.direct import run_stages
from stages.download.synthetic import generate_synthetic
from stages.features import stage as features
from stages.features import stream, units
from stages.features.normalize import normalize_rows
from stages.features.schemes import QUANTISED, encode_rows, fit_codec, fit_codec_blocks, row_blocks
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.features import write_part_features
from storage.graph import SPLITS, GraphArtifact
from storage.partition import PartitionArtifact
from tests.conftest import artifact_files

SCHEMES = ["auto", "float32", "float16", *QUANTISED]
OUT_CHUNK_ROWS = 7   # every part's store takes several output chunks
STREAM_ROWS = 23     # and the source is read in many chunks, none aligned with a part's output chunks


def in_memory_body(store: ArtifactStore, params: features.Params, upstream: dict[str, Manifest]) -> Any:
    """The features stage's body before streaming: the whole x in RAM, codecs fitted on it, each part's rows
    gathered, normalised, coded and written at once."""
    def body(writer: StageWriter) -> None:
        graph = GraphArtifact(store, upstream["download"]).read(edges=False)
        book = PartitionArtifact(store, upstream["partition"]).book()
        table, offsets = book.range_table(), graph.schema.orig_offsets()
        types = {t.name: i for i, t in enumerate(graph.schema.node_types)}
        codecs = {name: fit_codec(x, params.dtype, params.normalize) for name, x in graph.features.items()}
        for p in range(book.num_partitions):
            lo, hi = int(book.bounds[p]), int(book.bounds[p + 1])
            rows, chunks = {}, {}
            for name, x in graph.features.items():
                t_lo, t_hi = table.type_range(p, types[name])
                own = book.orig_of_gid[t_lo:t_hi] - offsets[types[name]]
                chunks[name] = params.chunk_rows or units.default_chunk_rows(t_hi - t_lo,
                                                                                codecs[name].itemsize * x.shape[1])
                rows[name] = encode_rows(normalize_rows(x[own], params.normalize), codecs[name], own)
            write_part_features(writer, part=p, start_gid=lo, features=rows, y=graph.y[book.orig_of_gid[lo:hi]],
                                split_lids=units.split_lids_of(graph.splits, book.gid_of_orig, lo, hi),
                                num_classes=graph.num_classes, chunk_rows=chunks,
                                schemes={n: c.scheme_record() for n, c in codecs.items()})
    return body


@pytest.fixture
def tiny_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream chunks of ``STREAM_ROWS`` rows whatever the budget (the stage's floor is 1 024 rows)."""
    monkeypatch.setattr(stream, "MIN_STREAM_ROWS", 1)
    monkeypatch.setattr(stream, "stream_rows", lambda t, budget, fixed: STREAM_ROWS)


def assert_streamed_as_in_memory(tmp_path: Path, store: ArtifactStore, upstream: dict[str, Manifest],
                                 **values: Any) -> Manifest:
    params = features.Params(chunk_rows=OUT_CHUNK_ROWS, memory_budget_bytes=64 << 20, **values)
    got = features.run(store, params, upstream, force=True, progress=False)
    reference = ArtifactStore(str(tmp_path / f"ref-{'-'.join(map(str, values.values()))}"))
    want = reference.build(features.NAME, features.VERSION, params.key_params(), upstream,
                           in_memory_body(store, params, upstream))
    assert got.key == want.key
    got_files, want_files = artifact_files(store, got), artifact_files(reference, want)
    assert sorted(got_files) == sorted(want_files)
    assert [f for f in got_files if got_files[f] != want_files[f]] == []
    s = got.summary
    assert s["memory_budget_bytes"] == 64 << 20 and {t["stream_rows"] for t in s["types"].values()} == {STREAM_ROWS}
    return got


def build_upstream(root: Path, **values: Any) -> tuple[ArtifactStore, dict[str, Manifest]]:
    store, m = run_stages({"artifacts": str(root), "num_partitions": 3, "until": "partition", **values})
    return store, {"download": m["download"], "partition": m["partition"]}


@pytest.fixture(scope="module")
def homogeneous(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, dict[str, Manifest]]:
    # 37 columns: a row spans numpy's 8 192-value reduction buffers unevenly (the l1 norms must not depend on it)
    return build_upstream(tmp_path_factory.mktemp("homogeneous"), num_nodes=300, num_features=37, num_classes=3)


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, dict[str, Manifest]]:
    # 400 nodes: 2 institutions for 3 parts, so a part owns no row of that type
    return build_upstream(tmp_path_factory.mktemp("typed"), dataset="synthetic-hetero", num_nodes=400,
                          num_features=6, num_classes=4)


@pytest.mark.parametrize("normalize", ["none", "l1"])
@pytest.mark.parametrize("dtype", SCHEMES)
def test_homogeneous_streamed_as_in_memory(tmp_path: Path, homogeneous, tiny_stream, dtype: str,
                                           normalize: str) -> None:
    store, upstream = homogeneous
    assert_streamed_as_in_memory(tmp_path, store, upstream, dtype=dtype, normalize=normalize)


@pytest.mark.parametrize("normalize", ["none", "l1"])
@pytest.mark.parametrize("dtype", SCHEMES)
def test_typed_streamed_as_in_memory(tmp_path: Path, typed, tiny_stream, dtype: str, normalize: str) -> None:
    store, upstream = typed
    assert len(GraphArtifact(store, upstream["download"]).schema.node_types) > 1   # tlids are not lids
    assert_streamed_as_in_memory(tmp_path, store, upstream, dtype=dtype, normalize=normalize)


def as_source(x: np.ndarray, dtype: str) -> np.ndarray:
    """Synthetic float32 rows in ``dtype``: bools their sign, integers x * 4 rounded."""
    if dtype == "bool":
        return x > 0
    if np.dtype(dtype).kind in "iu":
        return np.clip(np.round(x * 4), 0 if dtype == "uint8" else -128, 127).astype(dtype)
    return x.astype(dtype)


@pytest.mark.parametrize("source", ["bool", "int8", "uint8", "float16", "float64"])
def test_any_stored_dtype_streams_as_in_memory(tmp_path: Path, tiny_stream, source: str) -> None:
    g = generate_synthetic(250, 6.0, 19, 3, 0, split=(0.3, 0.2, 0.5), progress=False)
    d = tmp_path / "files"
    d.mkdir()
    np.save(d / "edge_index.npy", np.stack([g.indices, np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))]))
    np.save(d / "x.npy", as_source(g.x, source))
    np.save(d / "y.npy", g.y)
    for name in SPLITS:
        np.save(d / f"{name}_idx.npy", g.splits[name])
    store, upstream = build_upstream(tmp_path / "art", dataset="files", path=str(d))
    for dtype, normalize in (("auto", "none"), ("int8", "none"), ("auto", "l1"), ("float8_e4m3", "l1")):
        m = assert_streamed_as_in_memory(tmp_path, store, upstream, dtype=dtype, normalize=normalize)
        assert m.summary["source_dtype"] == source


@pytest.mark.parametrize("normalize", ["none", "l1"])
@pytest.mark.parametrize("dtype", SCHEMES)
@pytest.mark.parametrize("source", ["float32", "float64", "float16", "int8", "uint8", "bool"])
def test_chunked_fit_is_exact(source: str, dtype: str, normalize: str) -> None:
    """Any row blocks (1 row, 7 rows, uneven) give the whole x's scales and offsets bit for bit."""
    rng = np.random.default_rng(0)
    x = as_source((rng.standard_normal((101, 13)) * rng.uniform(0.01, 50, 13)).astype(np.float32), source)
    x[:, 3] = x[0, 3]   # a constant column: scale 1
    want = fit_codec(x, dtype, normalize)   # type: ignore[arg-type]
    for rows in (1, 7, 64, 1000):
        got = fit_codec_blocks(x.dtype, x.shape[1], row_blocks(x, rows), dtype, normalize)   # type: ignore[arg-type]
        assert (got.scheme, got.storage) == (want.scheme, want.storage)
        for a, b in ((got.scale, want.scale), (got.offset, want.offset)):
            assert (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def test_a_cast_never_reads_x() -> None:
    def blocks():
        raise AssertionError("a cast read x")
        yield
    codec = fit_codec_blocks(np.dtype(np.float64), 4, blocks(), "auto", "none")
    assert (codec.scheme, codec.storage) == ("cast", torch.float32)


def test_a_budget_below_the_minimum_fails_in_one_line_before_any_work(tmp_path: Path) -> None:
    # 3 000 nodes x 128 float32: the source chunk alone (1.5 MB) is over the smallest budget accepted (1 MiB)
    store, upstream = build_upstream(tmp_path / "art", num_nodes=3000, num_features=128, num_classes=3)
    with pytest.raises(InputError) as err:
        features.run(store, features.Params(memory_budget_bytes=1 << 20), upstream, progress=False)
    message = str(err.value)
    assert "\n" not in message and "features needs at least" in message and "raise memory_budget_bytes to" in message
    minimum = int(message.split("raise memory_budget_bytes to ")[1].split()[0])
    assert minimum > 1 << 20
    assert not os.path.exists(os.path.join(store.root, "features"))   # no stage dir, no scratch
    m = features.run(store, features.Params(memory_budget_bytes=minimum), upstream, progress=False)
    assert m.summary["memory_minimum_bytes"] == minimum and m.summary["memory_budget_bytes"] == minimum
