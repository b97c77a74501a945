"""The infer stage on a link prediction model: every node's embedding equals the trained encoder on the whole graph,
no classes are written, pairs are scored by the train artifact's decoder (``stages.infer.score``, ``gnnpipe
score``), and the link metrics from the exact embeddings are those recomputed from the stored embeddings (OGB's
Evaluator on ogbl-citation2 and ogbl-collab fixtures). One small pipeline (2 000 nodes, 2 partitions, 2 epochs)
serves most tests of the module; each ogbl fixture has its own (24 nodes, 1 partition, 1 epoch)."""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import zarr
from typer.testing import CliRunner

from flows.cli import app
from flows.cli_score import read_pairs
from flows.direct import run_stages
from stages.infer import stage as infer
from stages.infer.link_eval import scores_against
from stages.infer.rank import train_params
from stages.infer.score import link_build, load_decoder, pair_scores, score_pairs
from stages.runtime.seeds import STREAM_INFER_NEGATIVES, stream_seed
from stages.train.models.plugins import make_model
from stages.train.tasks.link_decoders import MLPDecoder
from stages.train.tasks.link_metrics import RankSums
from storage import ArtifactError, ArtifactStore, InputError, Manifest
from storage.graph import GraphArtifact
from storage.infer_artifact import EmbeddingBlocks, InferArtifact
from storage.partition import PartitionArtifact
from storage.train import MODEL
from tests import ogbl_fixture
from tests.conftest import GNNPIPE, REPO, cli_env

# ogb imports torch_geometric, which still calls torch.jit.script.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
ATOL = 1e-5   # float reassociation: chunked CSR sums and GEMMs against PyG's scatter on the whole graph
HIDDEN = 16
N = 2000   # nodes
CONFIG: dict[str, Any] = {
    "dataset": "synthetic-link", "task": "link", "download.num_nodes": N, "download.avg_degree": 10.0,
    "download.num_features": 16, "download.num_classes": 4, "download.seed": 1, "num_partitions": 2,
    "fanouts": (5, 5), "batch_size": 256, "hidden": HIDDEN, "epochs": 2, "lr": 0.01, "dropout": 0.0,
    "decoder": "mlp", "eval_negatives": 20, "edges_per_epoch": 4096, "threads_per_rank": 1, "timeout_s": 300.0,
    "peer_timeout_s": 60.0, "chunk_edges": 2000, "infer_threads_per_rank": 1, "infer_timeout_s": 300.0,
    "until": "infer"}


@dataclass
class Reference:
    """The trained encoder on the whole graph in orig ids (PyG's own forward, eval mode), and the decoder."""

    emb: np.ndarray           # [N, HIDDEN]: the encoder's outputs
    hidden: np.ndarray        # [N, HIDDEN]: its hidden layer (the input of convs[1])
    decoder: torch.nn.Module


@dataclass
class Built:
    store: ArtifactStore
    manifests: dict[str, Manifest]
    ref: Reference

    @property
    def manifest(self) -> Manifest:
        return self.manifests["infer"]

    @property
    def art(self) -> InferArtifact:
        return InferArtifact(self.store, self.manifest)


def whole_graph_reference(store: ArtifactStore, manifests: dict[str, Manifest]) -> Reference:
    graph = GraphArtifact(store, manifests["download"]).read()
    assert graph.x is not None
    params = train_params(manifests["train"])
    state = torch.load(io.BytesIO(store.read_bytes("train", manifests["train"].key, MODEL)), weights_only=True)
    encoder = make_model(params.model, {}, in_channels=graph.x.shape[1], hidden=HIDDEN, out_channels=HIDDEN,
                         num_layers=2, dropout=0.0, heads=params.gat_heads)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")})
    decoder = MLPDecoder(HIDDEN)
    decoder.load_state_dict({k.removeprefix("decoder."): v for k, v in state.items() if k.startswith("decoder.")})
    captured: dict[str, np.ndarray] = {}
    convs: Any = encoder.eval().convs
    handle = convs[1].register_forward_pre_hook(lambda _m, args: captured.__setitem__("h", args[0].numpy().copy()))
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))   # incoming CSR: indices are the sources
    with torch.no_grad():
        emb = encoder(torch.from_numpy(graph.x).float(), torch.from_numpy(np.stack([graph.indices, dst]).astype(
            np.int64)))
    handle.remove()
    return Reference(emb.numpy(), captured["h"], decoder.eval())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    store, manifests = run_stages({**CONFIG, "artifacts": str(tmp_path_factory.mktemp("art"))})
    return Built(store, manifests, whole_graph_reference(store, manifests))


def _pairs(num_nodes: int, count: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, num_nodes, count), rng.integers(0, num_nodes, count)
    dst[:10] = src[:10]   # self pairs and repeated ends score too
    return src, dst


def _expected(built: Built, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    emb = torch.from_numpy(built.ref.emb)
    with torch.no_grad():
        return built.ref.decoder(emb[src], emb[dst]).numpy()


# ---- the infer stage ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_every_nodes_embedding_is_the_encoder_on_the_whole_graph(built: Built):
    art, ref = built.art, built.ref
    n = ref.emb.shape[0]
    assert art.task == "link" and art.embeddings().shape == (n, HIDDEN)
    np.testing.assert_allclose(np.asarray(art.embeddings()[:]), ref.emb, rtol=1e-5, atol=ATOL)
    assert art.embedding_layers == [0]   # the encoder's last hidden layer too, as for a node model
    np.testing.assert_allclose(np.asarray(art.embeddings(0)[:]), ref.hidden, rtol=1e-5, atol=ATOL)
    parts = list(art.parts())
    assert len(parts) == 2
    np.testing.assert_array_equal(np.sort(np.concatenate([p.orig_id for p in parts if p.orig_id is not None])),
                                  np.arange(n))
    for p in parts:   # rows by lid, with their orig ids; no classes
        assert p.orig_id is not None and p.out is not None and p.pred is None and p.prob is None
        np.testing.assert_allclose(p.out, ref.emb[p.orig_id], rtol=1e-5, atol=ATOL)


@pytest.mark.slow
def test_no_classes_are_written_and_the_report_says_where_the_embeddings_are(built: Built):
    man, art = built.manifest, built.art
    assert "predictions.parquet" not in man.files and any(f.startswith("nodes.zarr/emb/out/") for f in man.files)
    assert set(art.nodes()) == {"emb"} and dict(art.nodes().attrs)["embedding_width"] == HIDDEN
    for read in (lambda: art.node_array("pred"), lambda: art.predictions_url):
        with pytest.raises(ArtifactError, match="link prediction model's node embeddings"):
            read()
    s = man.summary
    assert s["task"] == "link" and s["decoder"] == "mlp" and s["embedding_width"] == HIDDEN
    assert s["files"]["embeddings"] == "nodes.zarr/emb/out" and s["num_nodes"] == N
    assert not {"accuracy", "pred_count", "num_classes", "sampled_accuracy"} & set(s)
    assert s["train_test_metrics"] == built.manifests["train"].summary["test_metrics"]
    assert not any(k.startswith("infer/acc") for k in art.metrics()["scalars"])
    rep = infer.report(man)
    assert rep.headline.startswith(f"exact link prediction embeddings of {N:,} nodes ({HIDDEN} wide) on 2 rank(s)")
    assert f"{man.uri}/nodes.zarr/emb/out" in rep.headline and "`mlp` decoder" in rep.markdown


# ---- scoring -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_scores_are_the_decoder_on_the_embeddings_of_each_pair(built: Built):
    src, dst = _pairs(N)
    got = score_pairs(built.store, built.manifest, src, dst)
    assert got.dtype == np.float32 and got.shape == (500,)
    np.testing.assert_allclose(got, _expected(built, src, dst), rtol=1e-5, atol=ATOL)
    pieces = pair_scores(built.art.embedding_rows, built.ref.decoder, src, dst, piece=7)   # many pieces, same scores
    np.testing.assert_allclose(pieces, got, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_a_node_classifiers_build_is_not_scored(built: Built):
    node = built.manifest.model_copy(update={"summary": {**built.manifest.summary, "task": "node"}})
    with pytest.raises(InputError, match="pairs are scored with a link prediction model"):
        link_build(built.store, node)
    with pytest.raises(InputError, match=f"source id {N} is not a node id of the graph"):
        score_pairs(built.store, built.manifest, np.array([0, N]), np.array([1, 2]))


def _score(store: ArtifactStore, *args: str) -> Any:
    return CliRunner().invoke(app, ["score", *args, "--artifacts", store.root])


@pytest.mark.slow
def test_embeddings_of_a_model_retrained_since_are_not_scored(tmp_path: Path):
    """A model trained on a GPU is not reproducible: retrained under the same key, its decoder is not the one the
    infer build's embeddings came from, so scoring refuses in one line, before reading either build's files."""
    store = ArtifactStore(tmp_path)

    def gpu_train(writer) -> None:
        writer.write_json("model.json", {})
        writer.reproducible = False

    trained = store.build("train", 1, {}, {}, gpu_train)
    made = store.build("infer", 1, {}, {"train": trained}, lambda writer: writer.write_json("emb.json", {}))
    store.build("train", 1, {}, {}, gpu_train, force=True)
    with pytest.raises(InputError, match=rf"^infer/{made.key} was made from another build of train than "
                                         rf"train/{trained.key} holds now: rerun the pipeline"):
        link_build(store, made)


def test_gnnpipe_score_reads_npy_or_csv_and_writes_npy_or_parquet(built: Built, tmp_path: Path):
    src, dst = _pairs(N, 50)
    np.save(tmp_path / "pairs.npy", np.stack([src, dst]))
    result = _score(built.store, built.manifest.key[:6], "--pairs", str(tmp_path / "pairs.npy"), "--out",
                    str(tmp_path / "s.npy"))
    assert result.exit_code == 0, result.output
    assert f"scored 50 pairs with infer/{built.manifest.key}" in result.stdout and "mlp decoder" in result.stdout
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), _expected(built, src, dst), rtol=1e-5, atol=ATOL)
    (tmp_path / "pairs.csv").write_text("src,dst\n" + "".join(f"{s},{d}\n" for s, d in zip(src, dst)))
    result = _score(built.store, "--pairs", str(tmp_path / "pairs.csv"), "--out", str(tmp_path / "s.parquet"))
    assert result.exit_code == 0, result.output   # the root's only infer build
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.column_names == ["src", "dst", "score"]
    np.testing.assert_array_equal(table["src"].to_numpy(), src)
    np.testing.assert_array_equal(table["dst"].to_numpy(), dst)
    np.testing.assert_allclose(table["score"].to_numpy(), np.load(tmp_path / "s.npy"), rtol=0, atol=0)


@pytest.mark.slow
def test_gnnpipe_score_bad_input_is_one_error_line(built: Built, tmp_path: Path):
    np.save(tmp_path / "far.npy", np.array([[0, 1], [2, N]]))
    proc = subprocess.run([*GNNPIPE, "score", built.manifest.key, "--pairs", str(tmp_path / "far.npy"), "--out",
                           str(tmp_path / "s.npy"), "--artifacts", built.store.root], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line == (f"error: pair 1: destination id {N} is not a node id of the graph (0 to {N - 1}); 1 pair(s) "
                    f"out of range")
    assert not (tmp_path / "s.npy").exists()


@pytest.mark.parametrize(("content", "out", "message"), [
    (np.zeros((3, 4), dtype=np.int64), "s.npy", "holds int64 of shape [3, 4]: give integers of shape [2, E]"),
    (np.zeros((2, 4), dtype=np.float32), "s.npy", "holds float32 of shape [2, 4]"),
    (np.zeros((2, 0), dtype=np.int64), "s.npy", "holds no pairs"),
    ("0,1,2\n3,4,5\n", "s.npy", "has 3 columns: give two, src,dst"),
    ("0,1\n3,x\n", "s.npy", "give two integer columns src,dst"),
    (np.zeros((2, 4), dtype=np.int64), "s.csv", "give a .npy (the scores) or a .parquet"),
])
def test_bad_pairs_or_out_files_are_refused_before_any_build_is_read(tmp_path: Path, content: Any, out: str,
                                                                      message: str):
    if isinstance(content, str):
        pairs = tmp_path / "pairs.csv"
        pairs.write_text(content)
    else:
        pairs = tmp_path / "pairs.npy"
        np.save(pairs, content)
    result = CliRunner().invoke(app, ["score", "--pairs", str(pairs), "--out", str(tmp_path / out),
                                      "--artifacts", str(tmp_path / "none")])   # no store: refused before it
    assert isinstance(result.exception, InputError), result.output
    assert message in str(result.exception) and "\n" not in str(result.exception)


def test_csv_pairs_with_or_without_a_header(tmp_path: Path):
    for text in ("src,dst\n1,2\n3,4\n", "1,2\n3,4\n", " 1, 2\n3,4"):
        (tmp_path / "p.csv").write_text(text)
        src, dst = read_pairs(tmp_path / "p.csv")
        assert src.tolist() == [1, 3] and dst.tolist() == [2, 4] and src.dtype == np.int64
    (tmp_path / "p.csv").write_text("7,8\n")   # one pair: still [2, 1]
    assert [a.tolist() for a in read_pairs(tmp_path / "p.csv")] == [[7], [8]]
    with pytest.raises(InputError, match="give a .npy file of shape"):
        read_pairs(tmp_path / "p.txt")


# ---- link metrics from the exact embeddings --------------------------------------------------------------------
def _decode(decoder: torch.nn.Module, emb: np.ndarray, src: np.ndarray, dst: np.ndarray) -> torch.Tensor:
    e = torch.from_numpy(np.asarray(emb, dtype=np.float32))
    with torch.no_grad():
        return decoder(e[torch.from_numpy(src)], e[torch.from_numpy(dst)]).float()


@pytest.mark.slow
def test_synthetic_link_metrics_are_ranks_against_seeded_uniform_negatives(built: Built):
    """Recomputed independently: the whole-graph reference encoder, every valid/test positive, and each positive's own
    eval_negatives uniform destinations drawn from the train seed's STREAM_INFER_NEGATIVES, valid's then test's."""
    lm = built.manifest.summary["link_metrics"]
    parts = PartitionArtifact(built.store, built.manifests["partition"])
    book = parts.book()
    k, seed = CONFIG["eval_negatives"], built.manifests["train"].params.get("seed", 0)
    generator = torch.Generator().manual_seed(stream_seed(seed, 0, 0, STREAM_INFER_NEGATIVES))
    assert lm["evaluator"] == "RankSums" and lm["negatives"] == "uniform" and lm["headline"] == "mrr"
    for split in ("valid", "test"):
        pos = book.orig_of_gid[np.concatenate([parts.edge_split(p, split) for p in range(2)], axis=1)]
        neg = book.orig_of_gid[torch.randint(0, N, (pos.shape[1], k), generator=generator).numpy()]
        src = np.repeat(pos[0], k)
        scores = _decode(built.ref.decoder, built.ref.emb, src, neg.reshape(-1)).view(-1, k)
        want = RankSums.of(_decode(built.ref.decoder, built.ref.emb, pos[0], pos[1]), scores).means()
        got = lm[split]
        assert got["positives"] == pos.shape[1] > 0 and got["negatives"] == pos.shape[1] * k
        assert 0 < got["mrr"] <= 1
        for name, value in want.items():
            assert got[name] == pytest.approx(value, abs=1e-6), (split, name)
    scalars = built.art.metrics()["scalars"]
    assert scalars["infer/link_test_mrr"] == lm["test"]["mrr"] and "infer/link_valid_hits_at_10" in scalars
    rep = infer.report(built.manifest)
    assert f"test MRR {lm['test']['mrr']:.4f} from exact embeddings (the train stage's sampled test MRR" in \
        rep.headline
    assert "### Link metrics" in rep.markdown and "uniform negatives" in rep.markdown


def test_blocks_of_embeddings_score_as_the_whole_matrix(tmp_path: Path):
    """Several blocks (of whole chunks), kept one at a time: the same rows and negative scores as in memory."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((1000, 4)).astype(np.float32)
    array = zarr.open_array(str(tmp_path / "emb.zarr"), mode="w", shape=emb.shape, chunks=(64, 4), dtype="float32")
    array[:] = emb
    blocks = EmbeddingBlocks(array, block_bytes=200 * 4 * 4)   # 200 rows -> 192: 3 chunks a block
    assert blocks.block_rows == 192 and blocks.num_blocks == 6
    ids = rng.integers(0, 1000, 300)
    np.testing.assert_array_equal(blocks.gather(ids), emb[ids])
    decoder = MLPDecoder(4).eval()
    src, neg = rng.integers(0, 1000, 50), rng.integers(0, 1000, (50, 7))
    got = scores_against(blocks, decoder, torch.from_numpy(emb[src]), neg, piece=16)
    want = _decode(decoder, emb, np.repeat(src, 7), neg.reshape(-1)).view(50, 7)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    reads = blocks.reads
    blocks.gather(np.array([5, 7]))
    blocks.gather(np.array([9]))
    assert blocks.reads == reads + 1   # one block read, then kept


def _ogbl_pipeline(name: str, root: Path) -> tuple[ogbl_fixture.OgblFixture, ArtifactStore, dict[str, Manifest]]:
    fx = ogbl_fixture.build(name, root / "ogb")
    if name == "ogbl-collab":   # 120 shared negatives, so that Hits@50 is not 1 by default (OGB: < 50 negatives)
        rng = np.random.default_rng(1)
        for split in ("valid", "test"):
            fx.negatives[split] = rng.integers(0, ogbl_fixture.NUM_NODES, (2, 120))
            torch.save(ogbl_fixture._split_dict(name, fx.positives[split], fx.negatives[split]),
                       fx.root / "ogbl_collab" / "split" / "time" / f"{split}.pt")
    store, manifests = run_stages({
        "dataset": name, "task": "link", "download.download_dir": str(fx.root), "num_partitions": 1,
        "fanouts": (3, 3), "batch_size": 16, "hidden": 8, "epochs": 1, "eval_negatives": 5,
        "edges_per_epoch": None, "threads_per_rank": 1, "timeout_s": 120.0, "peer_timeout_s": 60.0,
        "infer_threads_per_rank": 1, "infer_timeout_s": 120.0, "until": "infer", "artifacts": str(root / "art")})
    return fx, store, manifests


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ogbl-citation2", "ogbl-collab"])
def test_ogbl_metrics_are_ogbs_evaluator_on_the_stored_embeddings(name: str, tmp_path: Path):
    from ogb.linkproppred import Evaluator

    fx, store, manifests = _ogbl_pipeline(name, tmp_path)
    man = manifests["infer"]
    lm = man.summary["link_metrics"]
    emb = np.asarray(InferArtifact(store, man).embeddings()[:])
    decoder = load_decoder(store, manifests["train"])
    evaluator = Evaluator(name)
    for split in ("valid", "test"):   # OGB's own positives and negatives, in orig ids, as the fixture wrote them
        src, dst = fx.positives[split]
        pos = _decode(decoder, emb, src, dst)
        if name == "ogbl-citation2":
            k = fx.negatives[split].shape[1]
            neg = _decode(decoder, emb, np.repeat(src, k), fx.negatives[split].reshape(-1)).view(-1, k)
            got = evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})
            want = {m: float(got[f"{m}_list"].double().mean()) for m in ("mrr", "hits@1", "hits@3", "hits@10")}
            assert lm[split]["negatives"] == src.size * k
        else:
            neg = _decode(decoder, emb, *fx.negatives[split])
            want = {"hits@50": float(evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})["hits@50"])}
            assert lm[split]["negatives"] == 120
        assert lm[split]["positives"] == src.size
        for metric, value in want.items():
            assert lm[split][metric] == pytest.approx(value, abs=1e-6), (split, metric)
    assert lm["evaluator"] == name
    head = "MRR" if name == "ogbl-citation2" else "Hits@50"
    assert f"test {head} {lm['test'][lm['headline']]:.4f} from exact embeddings" in infer.report(man).headline


# ---- gnnpipe export of a link build ------------------------------------------------------------------------------
@pytest.mark.slow
def test_export_npy_of_a_link_build_is_the_embeddings(built: Built, tmp_path: Path):
    out = tmp_path / "npy"
    result = CliRunner().invoke(app, ["export", "infer", built.manifest.key, "--format", "npy", "--out", str(out),
                                      "--artifacts", built.store.root])
    assert result.exit_code == 0, result.output
    names = ["orig_id.npy", "emb_out.npy", "emb_layer_0.npy"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "export.json"])
    np.testing.assert_array_equal(np.load(out / "orig_id.npy"), np.arange(N))
    np.testing.assert_array_equal(np.load(out / "emb_out.npy"), np.asarray(built.art.embeddings()[:]))
    np.testing.assert_array_equal(np.load(out / "emb_layer_0.npy"), np.asarray(built.art.embeddings(0)[:]))
    meta = json.loads((out / "export.json").read_text())
    assert meta["files"] == names and meta["task"] == "link" and meta["num_classes"] == 0
    assert "split_codes" not in meta
    missing = tmp_path / "parquet"   # no predictions table: refused, and no empty --out left behind
    result = CliRunner().invoke(app, ["export", "infer", built.manifest.key, "--format", "parquet", "--out",
                                      str(missing), "--artifacts", built.store.root])
    assert isinstance(result.exception, InputError) and "--format npy or zarr" in str(result.exception)
    assert not missing.exists()


def test_the_uniform_protocol_ranks_a_fixed_sample_of_at_most_eval_edges():
    from stages.infer.link_eval import sample_columns

    pairs = np.stack([np.arange(1000), np.arange(1000) + 5])
    kept = sample_columns(pairs, 100, seed=3, split=1)
    assert kept.shape == (2, 100) and np.all(np.diff(kept[0]) > 0) and np.array_equal(kept[1], kept[0] + 5)
    assert np.array_equal(kept, sample_columns(pairs, 100, seed=3, split=1))   # fixed: the same every build
    assert not np.array_equal(kept, sample_columns(pairs, 100, seed=3, split=2))   # valid and test apart
    assert sample_columns(pairs, 5000, seed=3, split=1) is pairs
