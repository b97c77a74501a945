"""Low-precision feature stores (docs/design.md §6): each ``features.dtype`` scheme round-trips within its error bound,
the manifest and the stores record it, rows are cached and exchanged in the storage dtype and decoded identically
wherever they are read (train's loader, the infer stage), and int8 / float8 train within a few points of float32."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stages.features.schemes import QUANTISED, encode_rows, fit_codec
from stages.infer.layerwise import Inference
from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_codec import FeatureCodec
from stages.runtime.feature_store import InMemoryFeatureStore, open_feature_store, open_part_store
from stages.train import stage as train
from stages.train.models.model import build_model
from storage import ArtifactStore, InputError
from storage.features import FeaturesArtifact
from storage.graph import GraphArtifact
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from storage.train import METRICS
from storage.train_summary import TrainSummary
from tests._precision_worker import TIMEOUT_S, WIRE_DTYPES, WORLD_SIZE, worker
from tests._spawn import spawn_ranks
from tests._train_pipeline import BATCH_SIZE, FANOUTS, build_without_prefect, train_params, train_upstream

DTYPES = ("auto", "bfloat16", "int8", "float8_e4m3")
ITEMSIZE = {"auto": 4, "bfloat16": 2, "int8": 1, "float8_e4m3": 1}
NUM_FEATURES = 16
GRAPH = {"num_nodes": 3000, "avg_degree": 10.0, "num_features": NUM_FEATURES, "num_classes": 4, "seed": 1,
         "split": (0.2, 0.1, 0.7)}
CACHE_BUDGET = 16 << 10   # bytes per rank: 256 float32 rows of 16 columns, fewer than a partition's ~1 500


def columns(rows: int = 2000, seed: int = 0) -> np.ndarray:
    """float32 columns over 9 orders of magnitude, one-signed ones, a constant and an all-zero column."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)) * np.logspace(-4, 4, 8)
    x[:, 1] = np.abs(x[:, 1]) + 5.0
    x[:, 2] = -np.abs(x[:, 2])
    x[:, 6] = 3.25
    x[:, 7] = 0.0
    return x.astype(np.float32)


def round_trip(x: np.ndarray, dtype: str) -> tuple[np.ndarray, FeatureCodec]:
    codec = fit_codec(x, dtype, "none")   # type: ignore[arg-type]
    codes = encode_rows(x, codec, np.arange(x.shape[0]))
    store = InMemoryFeatureStore(codec.held(codes), codec)
    return store.codec.decode(store.gather(torch.arange(x.shape[0]))).numpy(), codec


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "float8_e4m3"])
def test_round_trip_error_bounds(dtype: str) -> None:
    x = columns()
    if dtype == "float16":
        x = x[:, 2:]   # float16's range stops at 65 504 (a larger value is refused: test_bad_input_is_refused)
    got, codec = round_trip(x, dtype)
    err, ax = np.abs(got.astype(np.float64) - x), np.abs(x.astype(np.float64))
    ulp32 = 2.0**-23 * ax   # float32 rounding of the decode itself
    if dtype == "float16":   # 11 significant bits; the smallest columns fall into float16's subnormals (2^-24)
        assert (err <= 2.0**-11 * ax + 2.0**-25).all()
    elif dtype == "bfloat16":   # 8 significant bits, float32's exponent
        assert (err <= 2.0**-8 * ax).all()
    elif dtype == "int8":
        assert codec.scale is not None
        assert (err <= codec.scale.numpy() / 2 * (1 + 1e-5) + 2 * ulp32).all()
    else:   # 3 mantissa bits: half an ulp is 2^-4 of the value; half the smallest subnormal is 2^-10 of the scale
        assert codec.scale is not None
        assert (err <= np.maximum(2.0**-4 * ax, 2.0**-10 * codec.scale.numpy()) * (1 + 1e-5) + 2 * ulp32).all()
    assert (got[:, -2] == 3.25).all() and (got[:, -1] == 0).all()   # constant and zero columns come back exactly
    assert np.abs(err).max() > 0   # lossy at all: the bounds above are not vacuous


def test_int8_keeps_integer_columns_spanning_254_exactly() -> None:
    rng = np.random.default_rng(1)
    for x in (rng.integers(0, 255, size=(500, 4)).astype(np.uint8), rng.integers(-3, 9, size=(500, 4)),
              rng.random((500, 4)) > 0.5):
        got, codec = round_trip(x, "int8")
        assert np.array_equal(got, x.astype(np.float32)) and codec.scale is not None
        assert (codec.scale.numpy() == 1).all()
    wide = np.array([[0], [255]], dtype=np.int64)   # 256 values cannot be 255 codes: quantised, within scale/2
    got, codec = round_trip(wide, "int8")
    assert codec.scale is not None and codec.scale.item() == np.float32(255 / 254)
    assert np.abs(got - wide).max() <= codec.scale.item() / 2 * (1 + 1e-6)


def test_bfloat16_rounds_to_nearest_even() -> None:
    x = np.array([[1 + 2**-8], [1 + 3 * 2**-8], [-(1 + 2**-8)], [1 + 2**-8 + 2**-20]], dtype=np.float32)
    got, _ = round_trip(x, "bfloat16")   # halfway cases go to the even neighbour, the rest to the nearer one
    assert got[:, 0].tolist() == [1.0, 1 + 2**-6, -1.0, 1 + 2**-7]


def test_bad_input_is_refused() -> None:
    x = np.zeros((3, 2), dtype=np.float32)
    x[1, 1] = 3.4e38   # finite in float32; beyond bfloat16's largest, 3.3895e38, by more than half an ulp
    with pytest.raises(InputError, match=r"^x has 3\.39\d*e\+38 at row 11, column 1, beyond the range of bfloat16 "
                                         r"\(\|x\| <= 3\.38953e\+38\); set features\.dtype=float32$"):
        encode_rows(x, fit_codec(x, "bfloat16", "none"), np.array([10, 11, 12]))
    wide = np.zeros((3, 2))
    wide[2, 0] = -1e39   # beyond float32, where int8 and float8 scales are computed
    for dtype in ("int8", "float8_e4m3"):
        with pytest.raises(InputError, match=r"^x has -1e\+39 at row 12, column 0, beyond the range of float32"):
            encode_rows(wide, fit_codec(wide, dtype, "none"), np.array([10, 11, 12]))   # type: ignore[arg-type]
    coded = np.zeros((3, 2), dtype=np.int8)
    with pytest.raises(ValueError, match="scheme int8 needs scale=True, offset=True"):
        FeatureCodec("int8", torch.int8).check()
    with pytest.raises(ValueError, match="scheme int8 stores torch.int8, not torch.uint8"):
        FeatureCodec("int8", torch.uint8, scale=torch.ones(2), offset=torch.zeros(2)).check()
    with pytest.raises(ValueError, match="rows of torch.int8 for a codec holding torch.uint8"):
        InMemoryFeatureStore(torch.from_numpy(coded), FeatureCodec("float8_e4m3", torch.float8_e4m3fn,
                                                                   scale=torch.ones(2)))


# ---- through the stages: 2 partitions, one build per dtype (download and partition shared) ----------------------
@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("prec")
    values = {f"download.{k}": v for k, v in GRAPH.items()}
    out = {}
    for dtype in DTYPES:
        store, manifests = build_without_prefect({**values, "artifacts": str(root), "num_partitions": WORLD_SIZE,
                                                  "fanouts": FANOUTS, "batch_size": BATCH_SIZE, "dtype": dtype,
                                                  "cache_budget_bytes": CACHE_BUDGET, "until": "hotness"})
        out[dtype] = manifests
    return store, out


def test_manifest_and_stores_record_the_scheme(builds) -> None:
    store, by_dtype = builds
    x = GraphArtifact(store, by_dtype["auto"]["download"]).read().x
    assert x is not None
    book = PartitionArtifact(store, by_dtype["auto"]["partition"]).book()
    for dtype in DTYPES:
        summary = by_dtype[dtype]["features"].summary
        features = FeaturesArtifact(store, by_dtype[dtype]["features"])
        scheme, storage = QUANTISED.get(dtype, ("cast", torch.float32))
        want = fit_codec(x, dtype, "none")   # type: ignore[arg-type]
        record = summary["types"]["node"]
        assert (record["scheme"], record["feature_dtype"], summary["feature_dtype"]) == \
            (scheme, str(storage)[6:], str(storage)[6:])
        assert summary["bytes_features"] == x.shape[0] * NUM_FEATURES * ITEMSIZE[dtype]
        assert features.row_bytes == NUM_FEATURES * ITEMSIZE[dtype]
        codes = []
        for p in range(WORLD_SIZE):   # each partition holds the scales fitted over the whole x
            part = features.scheme(p)
            assert (part.name, part.storage_dtype) == (scheme, str(storage)[6:])
            for mine, whole in ((part.scale, want.scale), (part.offset, want.offset)):
                assert (mine is None) == (whole is None)
                assert mine is None or whole is None or np.array_equal(mine, whole.numpy())
            store_p = open_part_store(features, p)
            codes.append(store_p.gather(torch.arange(store_p.num_rows)))
            assert store_p.dtype == (torch.uint8 if dtype == "float8_e4m3" else storage)   # float8 as its bits
            assert features.x(p).attrs["scheme"] == scheme
        decoded = FeatureCodec.of(features.scheme(0)).decode(torch.cat(codes)).numpy()
        tol = {"auto": 0, "bfloat16": 2**-8, "int8": 2**-7, "float8_e4m3": 2**-4}[dtype]   # of the column range
        span = np.abs(x).max(axis=0)
        assert (np.abs(decoded - x[book.orig_of_gid]) <= tol * span + 1e-7).all()
    with pytest.raises(ValueError, match="open it with its codec"):
        open_feature_store(FeaturesArtifact(store, by_dtype["int8"]["features"]).x(0))


def test_cache_rows_per_byte_budget_grow_as_the_dtype_narrows(builds) -> None:
    store, by_dtype = builds
    for p in range(WORLD_SIZE):
        rows = {d: HotnessArtifact(store, by_dtype[d]["hotness"]).plan(p).attrs["plan_rows"] for d in DTYPES}
        assert rows == {d: CACHE_BUDGET // (NUM_FEATURES * ITEMSIZE[d]) for d in DTYPES}   # 256, 512, 1024, 1024


@pytest.mark.slow
def test_rows_are_exchanged_in_the_storage_dtype_and_decode_as_in_one_process(builds, tmp_path: Path) -> None:
    store, by_dtype = builds
    keys = {d: {s: by_dtype[d][s].key for s in ("partition", "features")} for d in DTYPES}
    ranks = spawn_ranks(worker, (store.root, keys), tmp_path, WORLD_SIZE, TIMEOUT_S)
    for rank, out in enumerate(ranks):   # every dtype crosses gloo, float8 and int16 as bytes
        for dtype in WIRE_DTYPES:
            sent, got = out["wire"][str(dtype)]
            assert got.dtype == dtype
            peer = ranks[1 - rank]["wire"][str(dtype)][0]
            mine = (sent[:2], peer[:2]) if rank == 0 else (peer[2:], sent[2:])
            assert torch.equal(got.view(torch.uint8), torch.cat(mine).view(torch.uint8))
    for dtype in DTYPES:
        features = FeaturesArtifact(store, by_dtype[dtype]["features"])
        codec = FeatureCodec.of(features.scheme(0))
        whole = torch.cat([open_part_store(features, p).gather(torch.arange(open_part_store(features, p).num_rows))
                           for p in range(WORLD_SIZE)])
        for out in ranks:
            res = out[dtype]
            c = res["counters"]
            assert res["stored_dtype"] == codec.carrier and res["row_bytes"] == NUM_FEATURES * ITEMSIZE[dtype]
            assert c["remote_rows"] > 0 and c["remote_bytes"] == c["remote_rows"] * NUM_FEATURES * ITEMSIZE[dtype]
            assert torch.equal(res["decoded"], codec.decode(whole.index_select(0, res["gid"])))


def test_infer_decodes_as_the_loader_does() -> None:
    """The infer stage's two layer-wise paths read int8 codes through ``DistFeatures.decode``: their outputs equal
    the model's on the decoded rows, which are the rows the loader hands the model in training."""
    rng = np.random.default_rng(0)
    n = 300
    pairs = rng.integers(0, n, (2, 1500))
    edge = np.unique(pairs[:, pairs[0] != pairs[1]], axis=1)   # no self loops (GAT adds its own), no duplicates
    edge = edge[:, np.argsort(edge[1], kind="stable")]         # incoming CSR: by dst
    indptr = np.r_[0, np.cumsum(np.bincount(edge[1], minlength=n))]
    x = rng.normal(size=(n, 8)).astype(np.float32) * 3
    codec = fit_codec(x, "int8", "none")
    codes = codec.held(encode_rows(x, codec, np.arange(n)))
    rows = DistFeatures(InMemoryFeatureStore(codes, codec), [0, n])
    decoded = rows.decode(rows.gather(torch.arange(n)))   # what NodeLoader.gather_rows returns
    assert not torch.equal(decoded, torch.from_numpy(x))
    for gather in (False, True):   # layer matrices with a halo; a per-chunk gather
        torch.manual_seed(0)
        model = build_model("sage", in_channels=8, hidden=16, out_channels=3, num_layers=2, dropout=0.0).eval()
        with torch.no_grad():
            ref = model(decoded, torch.from_numpy(edge))
        model.supports_offset_targets = not gather   # type: ignore[assignment]
        engine = Inference(model, 2, LocalCSR.from_numpy(indptr, edge[0]), np.array([0, n]), None, chunk_edges=400)
        with torch.inference_mode():
            out = engine.run(lambda: DistFeatures(InMemoryFeatureStore(codes, codec), [0, n]), [],
                             lambda _layer, _rows: None)
        assert engine.path.endswith("(per-chunk gather)" if gather else "(layer matrices and halo)")
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_int8_and_float8_train_within_a_few_points_of_float32(builds) -> None:
    store, by_dtype = builds
    acc = {}
    for dtype in ("auto", "int8", "float8_e4m3"):
        run = train.run(store, train_params(epochs=3), train_upstream(by_dtype[dtype]), log=lambda line: None)
        epochs = json.loads(store.read_bytes("train", run.key, METRICS))["epochs"]
        assert all(e["remote_bytes"] == e["remote_rows"] * NUM_FEATURES * ITEMSIZE[dtype] for e in epochs)
        assert all(e["cached_bytes"] == e["cached_rows"] * NUM_FEATURES * ITEMSIZE[dtype] for e in epochs)
        acc[dtype] = TrainSummary.from_json(run.summary).test_metric
    assert acc["auto"] > 0.5, acc   # chance 0.25
    assert abs(acc["int8"] - acc["auto"]) < 0.03 and abs(acc["float8_e4m3"] - acc["auto"]) < 0.03, acc


def test_a_typed_graphs_featured_type_is_coded_over_its_whole_x(tmp_path: Path) -> None:
    """synthetic-hetero: papers have features, the other types learnt embeddings; rows by tlid."""
    store, m = build_without_prefect({"artifacts": str(tmp_path), "dataset": "synthetic-hetero", "num_nodes": 400,
                                      "num_features": 6, "num_classes": 4, "num_partitions": 2, "dtype": "int8",
                                      "until": "features"})
    graph = GraphArtifact(store, m["download"]).read()
    features = FeaturesArtifact(store, m["features"])
    partition = PartitionArtifact(store, m["partition"])
    table, book = partition.range_table(), partition.book()
    types = [t.name for t in graph.schema.node_types]
    offsets = graph.schema.orig_offsets()
    assert set(features.featured_types) == set(graph.features) == {"paper"}
    for name, x in graph.features.items():
        assert m["features"].summary["types"][name]["scheme"] == "int8"
        want = fit_codec(x, "int8", "none")
        t = types.index(name)
        for p in range(2):
            store_p = open_part_store(features, p, name)
            assert store_p.codec.scale is not None and want.scale is not None
            assert torch.equal(store_p.codec.scale, want.scale)   # the type's whole x, in every part
            t_lo, t_hi = table.type_range(p, t)
            orig = book.orig_of_gid[t_lo:t_hi] - offsets[t]
            got = store_p.codec.decode(store_p.gather(torch.arange(store_p.num_rows))).numpy()
            assert (np.abs(got - x[orig]) <= want.scale.numpy() / 2 * (1 + 1e-5) + 1e-6).all()
