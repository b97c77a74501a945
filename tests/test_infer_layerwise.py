"""The infer stage's computation in one process (no torchrun): layer-wise inference equals PyG's forward on the whole
graph for each model, placement and CSR width; the chunks, the layer matrices' memory rules, the params and the
checks before any rank starts. The end-to-end runs are ``test_infer.py``'s."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch

from flows.config import ORDER, make_config, stage_keys
from stages.infer import stage as infer
from stages.infer.chunks import chunk_edges_of, plan_chunks
from stages.infer.halo import Halo, device_chunk_edges
from stages.infer.layerwise import Inference
from stages.infer.params import Params
from stages.jobs.launcher import RankFailure, failure_message, launch
from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import InMemoryFeatureStore
from stages.train.models.model import build_model
from storage import InputError, Manifest
from tests._infer_cases import ATOL, random_graph, run_one_process


def test_chunks_cover_every_node_within_the_edge_budget():
    indptr = torch.tensor([0, 3, 3, 103, 104, 110, 111])   # degrees 3, 0, 100 (a hub), 1, 6, 1
    chunks = plan_chunks(indptr, 9)   # weights (in-degree + 1) 4, 1, 101, 2, 7, 2
    assert chunks == [(0, 2), (2, 3), (3, 5), (5, 6)]
    weight = torch.diff(indptr) + 1
    for a, b in chunks:
        assert b - a == 1 or int(weight[a:b].sum()) <= 9
    assert plan_chunks(torch.tensor([0]), 8) == []


@pytest.mark.parametrize("kind, norm, gather", [("sage", None, False), ("gcn", None, False), ("gat", None, True),
                                                ("sage", "batch_norm", False), ("gcn", "batch_norm", False),
                                                ("sage", None, True), ("gcn", "batch_norm", True)])
def test_layerwise_in_one_process_equals_pyg_on_the_whole_graph(kind: str, norm: str | None, gather: bool):
    """Both layer-wise paths: from layer matrices (SAGE, GCN) and with a per-chunk gather (GAT; any model)."""
    indptr, indices, edge_index = random_graph()
    torch.manual_seed(0)
    x = torch.randn(indptr.shape[0] - 1, 8)
    kwargs: dict[str, Any] = {} if norm is None else {"norm": norm}
    model = build_model(kind, in_channels=8, hidden=16, out_channels=3, num_layers=3, dropout=0.5, **kwargs).eval()
    for module in model.modules():   # running statistics that are not the identity
        if isinstance(module, torch.nn.BatchNorm1d):
            assert module.running_mean is not None and module.running_var is not None
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    captured: dict[int, torch.Tensor] = {}
    convs: Any = model.convs
    hooks = [convs[i + 1].register_forward_pre_hook(
        lambda _m, args, i=i: captured.__setitem__(i, args[0].detach())) for i in range(2)]
    with torch.no_grad():
        ref = model(x, torch.from_numpy(edge_index))
    for hook in hooks:
        hook.remove()
    if gather:   # what a block model without supports_offset_targets gets
        model.supports_offset_targets = False   # type: ignore[assignment]
    out, hidden, engine = run_one_process(model, 3, x, indptr, indices, chunk_edges=300)
    assert engine.path == ("layer-wise (per-chunk gather)" if gather else "layer-wise (layer matrices and halo)")
    assert len(engine.chunks) > 3
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=ATOL)
    for layer in (0, 1):
        torch.testing.assert_close(hidden[layer], captured[layer], rtol=1e-5, atol=ATOL)
    if not gather:   # the matrices path runs no collective per chunk: no padding chunks
        return
    # extra empty chunks (a rank past its last chunk) change nothing
    engine = Inference(model, 3, LocalCSR.from_numpy(indptr, indices), np.array([0, x.shape[0]]),
                       engine.degrees, chunk_edges=10**9)
    engine.num_chunks = 3
    with torch.inference_mode():
        again = engine.run(lambda: DistFeatures(InMemoryFeatureStore(x), [0, x.shape[0]]), [], lambda layer, rows: None)
    torch.testing.assert_close(again, ref, rtol=1e-5, atol=ATOL)


def _with_self_loops(indptr: np.ndarray, indices: np.ndarray, every: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The incoming CSR with an edge i -> i added for every ``every``-th node (a graph the canonical builds never
    hold, but a plug-in's or an import's may)."""
    n = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n), np.diff(indptr))
    loops = np.arange(0, n, every)
    src, dst = np.r_[indices, loops], np.r_[dst, loops]
    order = np.lexsort((src, dst))
    return np.r_[0, np.cumsum(np.bincount(dst, minlength=n))], src[order]


@pytest.mark.parametrize("kind, fanouts, loops", [("sage", None, False), ("gcn", None, False), ("gcn", None, True),
                                                  ("sage", (3, 2, 2), True), ("gcn", (4, 1, 2), False)])
def test_the_device_placements_of_the_layer_matrices_infer_what_the_host_matrices_do(kind: str, fanouts: Any,
                                                                                    loops: bool):
    """A CUDA rank's two placements (``Inference._placement``), run on the CPU: the whole matrix on the device
    (a budget it fits) or each chunk's rows gathered (a budget it does not): the same logits and hidden rows as the
    steps reading the host matrix in place, self loops included (a chunk's own sources keep their target
    positions). tests/test_gpu_infer.py runs them on a GPU."""
    indptr, indices, _ = random_graph()
    if loops:
        indptr, indices = _with_self_loops(indptr, indices)
    torch.manual_seed(1)
    x = torch.randn(indptr.shape[0] - 1, 8)
    model = build_model(kind, in_channels=8, hidden=16, out_channels=3, num_layers=3, dropout=0.0).eval()
    runs = {budget: run_one_process(model, 3, x, indptr, indices, chunk_edges=300, fanouts=fanouts,
                                     device_budget=budget) for budget in (None, 1 << 30, 0)}
    (host, host_hidden, engine) = runs[None]
    assert [s.placement for s in engine.stats] == ["host"] * 3
    host_chunks = [s.chunks for s in engine.stats]
    # exact: chunks of 300 edges (sampled: of whole SAMPLE_BLOCK blocks, one here)
    assert fanouts is not None or min(host_chunks) > 1
    for budget, placement in ((1 << 30, "device"), (0, "chunks")):
        out, hidden, engine = runs[budget]
        assert [s.placement for s in engine.stats] == [placement] * 3
        # a layer whose matrix sits on the device and whose edges are a slice of the CSR there (exact) takes what
        # the budget leaves, in as few chunks: here one; sampled edges are drawn on the host, in chunk_edges' chunks
        on_device = placement == "device" and fanouts is None
        assert [s.chunks for s in engine.stats] == ([1] * 3 if on_device else host_chunks)
        torch.testing.assert_close(out, host, rtol=1e-6, atol=1e-6)
        for layer in (0, 1):
            torch.testing.assert_close(hidden[layer], host_hidden[layer], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="needs a device_budget"):
        Inference(model, 3, LocalCSR.from_numpy(indptr, indices), np.array([0, x.shape[0]]), None, 300,
                  device=torch.device("cuda"))


def test_a_layer_matrix_goes_to_the_device_only_when_it_fits_beside_the_outputs_and_a_chunk():
    indptr, indices, _ = random_graph()
    n = indptr.shape[0] - 1
    model = build_model("sage", in_channels=8, hidden=16, out_channels=3, num_layers=2, dropout=0.0).eval()
    engine = Inference(model, 2, LocalCSR.from_numpy(indptr, indices), np.array([0, n]), None, 300)
    halo = Halo.of(engine.csr)
    matrix = torch.zeros(halo.rows, 8)
    # the matrix, the layer's outputs (16 columns) and a chunk's temporaries: 300 x ((8 + 16) x 3 x 4 + 48) bytes
    needed = halo.rows * 8 * 4 + n * 16 * 4 + 300 * ((8 + 16) * 3 * 4 + 48)
    engine.device_budget = needed
    assert engine._placement(model, 0, matrix, halo) == "device"
    engine.device_budget = needed - 1
    assert engine._placement(model, 0, matrix, halo) == "chunks"
    # a device-placed layer's chunks: what the budget leaves beside the matrix and outputs, never under chunk_edges
    per_edge = (8 + 16) * 3 * 4 + 48
    assert device_chunk_edges(matrix, halo, 16, 300, needed) == 300
    # half the spare: the other half for what the estimate leaves out
    assert device_chunk_edges(matrix, halo, 16, 300, needed + 2000 * per_edge + 2 * per_edge - 1) == 1150
    assert device_chunk_edges(matrix, halo, 16, 300, 0) == 300


@pytest.mark.parametrize("gather, fanouts", [(False, None), (True, None), (False, (3, 2)), (True, (3, 2))])
def test_an_int32_csr_infers_what_an_int64_one_does(gather: bool, fanouts: tuple[int, ...] | None):
    """Ranks hold their part's indices as stored (int32 below 2^31 nodes, ``PartitionArtifact.csr(native=True)``):
    every path widens only a chunk's entries, and gives the same outputs, bit for bit, as from int64."""
    indptr, indices, _ = random_graph(3000, 15000)
    torch.manual_seed(5)
    x = torch.randn(indptr.shape[0] - 1, 8)
    model = build_model("sage", in_channels=8, hidden=16, out_channels=3, num_layers=2, dropout=0.0).eval()
    if gather:
        model.supports_offset_targets = False   # type: ignore[assignment]
    wide, wide_hidden, _ = run_one_process(model, 2, x, indptr, indices, chunk_edges=4000, fanouts=fanouts, seed=1)
    narrow, narrow_hidden, engine = run_one_process(model, 2, x, indptr, indices.astype(np.int32),
                                                     chunk_edges=4000, fanouts=fanouts, seed=1)
    assert engine.csr.indices.dtype == torch.int32 and len(engine.chunks) > 1
    torch.testing.assert_close(narrow, wide, rtol=0, atol=0)
    torch.testing.assert_close(narrow_hidden[0], wide_hidden[0], rtol=0, atol=0)


def test_sampled_inference_with_every_neighbour_is_exact_and_a_sample_does_not_depend_on_the_chunks():
    indptr, indices, _ = random_graph(3000, 15000)   # three sampling blocks of SAMPLE_BLOCK lids
    torch.manual_seed(1)
    x = torch.randn(indptr.shape[0] - 1, 8)
    model = build_model("sage", in_channels=8, hidden=16, out_channels=3, num_layers=2, dropout=0.0).eval()
    exact, _, _ = run_one_process(model, 2, x, indptr, indices, chunk_edges=5000)
    full, _, _ = run_one_process(model, 2, x, indptr, indices, chunk_edges=5000, fanouts=(-1, -1))
    torch.testing.assert_close(full, exact)
    one, _, e1 = run_one_process(model, 2, x, indptr, indices, chunk_edges=5000, fanouts=(3, 2), seed=4)
    two, _, _ = run_one_process(model, 2, x, indptr, indices, chunk_edges=5000, fanouts=(3, 2), seed=4)
    torch.testing.assert_close(one, two, rtol=0, atol=0)
    assert not torch.allclose(one, exact)
    other, _, e3 = run_one_process(model, 2, x, indptr, indices, chunk_edges=10**6, fanouts=(3, 2), seed=4)
    torch.testing.assert_close(one, other, rtol=1e-6, atol=1e-6)   # the same draws whatever the chunking
    assert len(e1.chunks) > 1 and len(e3.chunks) == 1
    seeded, _, _ = run_one_process(model, 2, x, indptr, indices, chunk_edges=5000, fanouts=(3, 2), seed=5)
    assert not torch.allclose(one, seeded)
    n = x.shape[0]
    deg = torch.from_numpy(np.diff(indptr))
    assert e1.stats[0].edges == int(deg.clamp(max=2).sum()) and e1.stats[1].edges == int(deg.clamp(max=3).sum())
    assert n == e1.csr.num_nodes


def test_a_padding_chunk_is_empty_in_sampled_inference_too():
    """A rank with fewer chunks than the largest runs empty ones ``(n, n)``; sampled inference refused them (its
    chunks must start at a sampling block), which failed every products-scale run whose ranks' counts differed."""
    from stages.runtime.csr import LocalCSR

    indptr, indices, _ = random_graph(3000, 15000)
    csr = LocalCSR.from_numpy(indptr, indices)
    n = csr.num_nodes
    for fanout in (-1, 5):
        row_pos, nbr_gid, edge_type = chunk_edges_of(csr, n, n, fanout, lambda k: torch.Generator().manual_seed(k))
        assert row_pos.numel() == 0 and nbr_gid.numel() == 0 and edge_type is None


def test_params_key_and_config_routes():
    assert Params(chunk_edges=5, timeout_s=1, peer_timeout_s=1, threads_per_rank=3, device="cpu").key_params() == \
        Params().key_params() == {"fanouts": None, "embeddings": "last"}
    assert Params(fanouts="10,5", seed=3).key_params() == {"fanouts": [10, 5], "embeddings": "last", "seed": 3}
    with pytest.raises(InputError, match="invalid parameter fanouts='10,0'"):
        Params(fanouts="10,0")
    assert ORDER[-1] == "infer"
    assert "infer" not in make_config(until="train").stages()
    cfg = make_config({"fanouts": "7,7", "infer.fanouts": "3,3", "infer_embeddings": "all", "chunk_rows": 4096})
    assert cfg.train.fanouts == (7, 7) and cfg.infer.fanouts == (3, 3) and cfg.infer.embeddings == "all"
    assert cfg.features.chunk_rows == 4096 and make_config(timeout_s=5).train.timeout_s == 5   # short names kept
    on_cpu = make_config(device="cpu")   # one word for both jobs; infer's alone by its own name
    assert on_cpu.train.device == on_cpu.infer.device == "cpu"
    assert make_config({"infer.device": "cuda"}).infer.device == "cuda" and make_config().train.device == "auto"
    keys = stage_keys(cfg)
    assert keys["infer"] != stage_keys(make_config({"fanouts": "7,7"}))["infer"]


def _manifest(stage: str, key: str, params: dict[str, Any], upstream: dict[str, str]) -> Manifest:
    return Manifest(stage=stage, version=1, key=key, params=params, upstream=upstream, created="", files={},
                    bytes=0, summary={}, libraries={}, uri="", build_id="")


def test_inputs_are_checked_before_any_rank_starts():
    part, feat = _manifest("partition", "p1", {}, {}), _manifest("features", "f1", {}, {"partition": "p1"})
    trained = _manifest("train", "t1", {"model": "sage", "fanouts": [5, 5]}, {"partition": "p1", "features": "f1",
                                                                            "hotness": "h1"})
    assert infer.check_inputs(part, feat, trained, Params()) == 2
    with pytest.raises(InputError, match="infer.fanouts has 3 value"):
        infer.check_inputs(part, feat, trained, Params(fanouts=(5, 5, 5)))
    other = _manifest("partition", "p2", {}, {})
    with pytest.raises(InputError, match="was trained on partition p1, not on the partition p2"):
        infer.check_inputs(other, feat, trained, Params())


def test_launcher_failures_are_said_as_inference():
    def said(failed: list[RankFailure]) -> str:
        err = failure_message(failed, {}, 1, job=infer.INFERENCE)
        assert isinstance(err, infer.InferenceError)
        return str(err)

    assert said([RankFailure(1, -9, True)]) == "inference failed: rank 1 was killed by SIGKILL; the job was stopped"
    assert said([]) == "inference failed: torchrun exited with code 1 before naming a rank (see the log above)"
    err = failure_message([], {}, -15, job=infer.INFERENCE)
    assert str(err) == ("inference was stopped by a signal: torchrun received SIGTERM from outside gnnpipe (a "
                        "scheduler, `kill`, the OOM killer) and its ranks were stopped")
    user = {0: {"rank": 0, "type": "InputError", "user_error": True, "message": "something the user can fix"}}
    err = failure_message([RankFailure(0, 1, True)], user, 1, job=infer.INFERENCE)
    assert isinstance(err, InputError) and str(err) == "rank 0: something the user can fix"


def test_an_inference_timeout_says_infer_timeout_s(tmp_path):
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(infer.InferenceError) as err:
        launch("unused", 1, result_dir=str(tmp_path), log=lambda line: None, timeout_s=0.5, grace_s=1,
               command=command, job=infer.INFERENCE)
    assert str(err.value) == ("inference timed out after 0.5 s and was stopped; raise infer.timeout_s (now 0.5 s) "
                              "and rerun")


def test_layer_matrices_read_a_zarr_feature_store_piece_by_piece(tmp_path):
    """Past the memory budget the rank's features stay in Zarr: layer 0's matrix reads them in row pieces (no
    whole-x copy in RAM); with a budget of 0 the matrices are memory-mapped too; the same outputs as from RAM."""
    import zarr

    from stages.infer.matrices import MatrixSpace
    from stages.runtime.feature_store import ZarrFeatureStore

    indptr, indices, _ = random_graph()
    torch.manual_seed(2)
    x = torch.randn(indptr.shape[0] - 1, 8)
    array = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=tuple(x.shape), chunks=(37, 8),
                            dtype="float32")
    array[:] = x.numpy()
    model = build_model("gcn", in_channels=8, hidden=16, out_channels=3, num_layers=2, dropout=0.0).eval()
    in_ram, hidden_ram, engine = run_one_process(model, 2, x, indptr, indices, chunk_edges=100)
    n = x.shape[0]
    assert engine.from_matrices and n > 100 and engine.space.mapped_count == 0
    scratch = tmp_path / "scratch"
    zarr_engine = Inference(model, 2, LocalCSR.from_numpy(indptr, indices), np.array([0, n]), engine.degrees,
                            chunk_edges=100, space=MatrixSpace(0, str(scratch)))
    hidden: dict[int, torch.Tensor] = {}
    with torch.inference_mode():
        from_zarr = zarr_engine.run(lambda: DistFeatures(ZarrFeatureStore(array), [0, n]), [0],
                                    lambda layer, rows: hidden.__setitem__(layer, rows.clone()))
    torch.testing.assert_close(from_zarr, in_ram, rtol=0, atol=0)   # the same operations on the same values
    torch.testing.assert_close(hidden[0], hidden_ram[0], rtol=0, atol=0)
    space = zarr_engine.space
    # every matrix mapped: layer 0's [n, 8], layer 1's input [n, 16] and the logits [n, 3]; none held in RAM
    assert space.mapped_count == 3 and space.mapped_bytes == n * (8 + 16 + 3) * 4 and space.peak_held_bytes == 0
    assert isinstance(from_zarr, torch.Tensor) and list(scratch.iterdir()) == []   # unlinked once mapped


def test_a_layer_matrix_takes_ram_while_it_fits_the_budget_beside_what_is_held(tmp_path):
    """x in RAM counts against the rank's budget until layer 0's matrix holds its rows; each later matrix takes
    RAM if it fits beside its input, else it is mapped."""
    from stages.infer.matrices import MatrixSpace

    indptr, indices, _ = random_graph()
    n = indptr.shape[0] - 1
    torch.manual_seed(3)
    x = torch.randn(n, 8)
    model = build_model("sage", in_channels=8, hidden=16, out_channels=3, num_layers=3, dropout=0.0).eval()
    ref, _, _ = run_one_process(model, 3, x, indptr, indices, chunk_edges=150)
    # a budget of 17 columns' rows: x (8) + layer 0's matrix (8) fit; layer 1's [n, 16] does not fit beside its
    # input (8) and is mapped; layer 2's [n, 16] then fits (its input mapped); the logits [n, 3] beside it do not
    budget = n * 4 * 17
    out, _, engine = run_one_process(model, 3, x, indptr, indices, chunk_edges=150,
                                      space=MatrixSpace(budget, str(tmp_path)))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    space = engine.space
    assert space.mapped_count == 2 and space.mapped_bytes == n * 4 * (16 + 3)
    assert space.peak_held_bytes == n * 4 * 16 and space.held_bytes == 0   # every input released
    with pytest.raises(ValueError, match="scratch directory"):
        MatrixSpace(0).empty(2, 2)


@pytest.mark.parametrize("kind, split, fanouts", [("gcn", 170, None), ("sage", 0, None), ("sage", 130, (3, 2))])
def test_layer_matrices_on_two_ranks_equal_one_process(tmp_path, kind, split, fanouts):
    """Two gloo ranks through the halo exchange (rank 0 owning no node when ``split`` is 0) equal one process
    (exact) and the per-chunk gather path on the same ranks (the same draws when sampled): every rank joins every
    halo piece, whatever it owns."""
    from tests._infer_worker import TIMEOUT_S, WORLD_SIZE, worker
    from tests._spawn import spawn_ranks

    indptr, indices, _ = random_graph()
    n = indptr.shape[0] - 1
    torch.manual_seed(4)
    x = torch.randn(n, 8)
    model = build_model(kind, in_channels=8, hidden=16, out_channels=3, num_layers=2, dropout=0.0).eval()
    got = spawn_ranks(worker, ((indptr, indices), [0, split, n], kind, model.state_dict(), x, fanouts), tmp_path,
                      WORLD_SIZE, TIMEOUT_S * 2)
    assert all(g["path"] == "layer-wise (layer matrices and halo)" for g in got)
    assert any(h > 0 for g in got for h in g["halo_rows"]) == (split > 0)
    matrices = torch.cat([g["matrices"] for g in got])
    torch.testing.assert_close(matrices, torch.cat([g["gather"] for g in got]), rtol=1e-5, atol=ATOL)
    if fanouts is None:
        whole, _, _ = run_one_process(model, 2, x, indptr, indices, chunk_edges=200)
        torch.testing.assert_close(matrices, whole, rtol=1e-5, atol=ATOL)


def test_inference_ranks_share_the_gpus_the_host_has(monkeypatch):
    """Faked GPUs: cuda spreads the ranks evenly over them (gloo's exchange does not mind two on one), auto keeps
    training's rule (a GPU each, else the CPU), and each rank's device budget is its share, less the reserve."""
    from stages.infer.rank import device_budget
    from stages.infer.worker import infer_device
    from stages.train.rank.cache_budget import FIXED_RESERVE_BYTES

    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    cuda0 = torch.device("cuda", 0)
    assert [infer_device("cuda", r, 2) for r in (0, 1)] == [cuda0, cuda0] and chosen == [0, 0]
    assert infer_device("auto", 0, 2) == torch.device("cpu") and infer_device("auto", 0, 1) == cuda0
    assert infer_device("cpu", 0, 1) == torch.device("cpu")
    ten = 10 << 30
    assert device_budget(cuda0, 2, free_bytes=lambda d: ten) == int(0.9 * ten / 2) - FIXED_RESERVE_BYTES
    assert device_budget(cuda0, 1, free_bytes=lambda d: 1 << 20) == 0   # less than the reserve: chunk by chunk
    assert device_budget(torch.device("cpu"), 2) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [infer_device("cuda", r, 4) for r in range(4)] == [cuda0, cuda0, torch.device("cuda", 1),
                                                             torch.device("cuda", 1)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="this host has no GPU"):
        infer_device("cuda", 0, 1)


@pytest.mark.parametrize("kind", ["sage", "gat"])   # the layer matrices' path, the per-chunk gather's
def test_a_hidden_layer_written_in_the_background_is_waited_for_before_its_rows_are_released(kind: str):
    """``on_hidden`` may begin a write and return its wait (the rank writes beside the next layer): the engine
    calls it before it releases those rows and before ``run`` returns, and a failed write's error comes out."""
    indptr, indices, _ = random_graph()
    x = torch.randn(indptr.shape[0] - 1, 8)
    model = build_model(kind, in_channels=8, hidden=16, out_channels=3, num_layers=3, dropout=0.0).eval()
    n = x.shape[0]
    events: list[tuple[str, int]] = []
    engine = Inference(model, 3, LocalCSR.from_numpy(indptr, indices), np.array([0, n]), None, 300)
    release = engine.space.release
    engine.space.release = lambda t: (events.append(("release", int(t.shape[-1]))), release(t))[1]

    def on_hidden(layer: int, rows: torch.Tensor) -> Any:
        events.append(("hidden", layer))
        return lambda: events.append(("waited", layer))
    features = DistFeatures(InMemoryFeatureStore(x), [0, n])
    with torch.inference_mode():
        engine.run(lambda: features, [0, 1], on_hidden)
    # each hidden layer (16 columns) is waited for before the matrix that holds it is released, and all by the end
    for layer in (0, 1):
        handed, waited = events.index(("hidden", layer)), events.index(("waited", layer))
        released = next((i for i in range(handed, len(events)) if events[i][0] == "release"), len(events))
        assert handed < waited < released, events
    assert [e for e in events if e[0] == "waited"] == [("waited", 0), ("waited", 1)]

    def failing(layer: int, rows: torch.Tensor) -> Any:
        def wait() -> None:
            raise OSError("disk full")
        return wait
    engine = Inference(model, 3, LocalCSR.from_numpy(indptr, indices), np.array([0, n]), None, 300)
    with torch.inference_mode(), pytest.raises(OSError, match="disk full"):
        engine.run(lambda: features, [0, 1], failing)
