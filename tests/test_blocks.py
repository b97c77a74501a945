"""Per-layer (block) computation: equal to PyG's models on the whole sampled batch, GCN with the true degrees equal
to full-graph GCN (one process and 2 gloo ranks), the sampled GCN unbiased, the fused ReLU + dropout, bfloat16
products, and a batch's promise that its edges come by target. The trainer around the blocks:
``test_block_training.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler
from stages.train.models.blocks import BatchGraph, Block, _keep_mask, make_blocks, relu_dropout
from stages.train.models.model import MODELS, build_model, is_block_model, needs_degrees, seed_logits
from tests._block_graphs import (
    PYG,
    SIZES,
    features,
    full_graph_gcn,
    messy_graph,
    pyg_twin,
    true_degrees,
)
from tests._blocks_worker import GCN_SIZES, TIMEOUT_S, WORLD_SIZE, seeds_of, worker
from tests._sampler_graphs import NUM_NODES, power_law_graph
from tests._spawn import spawn_ranks

# tiny models: one torch thread each (tests/conftest.py's one_torch_thread)
pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("fanouts", [[4, 3], [-1, -1], [3, -1, 2], [2]])
@pytest.mark.parametrize("kind", list(PYG))   # the relational models and the MLP: tests/test_typed_train.py
def test_blocks_equal_pyg_on_the_whole_sampled_batch(kind, fanouts):
    csr, x = LocalCSR.from_numpy(*messy_graph()), features()
    sampler = NeighborSampler(csr, fanouts, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = build_model(kind, **SIZES, num_layers=len(fanouts)).eval()
    twin = pyg_twin(kind, model, len(fanouts)).eval()
    assert is_block_model(model) and not is_block_model(twin)
    for seed_gid in (torch.arange(0, NUM_NODES, 37), torch.tensor([3])):
        batch = sampler.sample(seed_gid)
        with torch.no_grad():
            whole = twin(x[batch.n_id], batch.edge_index)[:batch.batch_size]
            assert torch.allclose(seed_logits(model, x[batch.n_id], batch), whole, atol=1e-5), (kind, fanouts)
            assert torch.equal(seed_logits(twin, x[batch.n_id], batch), whole), "a plain PyG model runs whole"


@pytest.mark.parametrize(("kind", "kwargs", "blocks"), [
    ("sage", {"aggr": "max"}, True), ("sage", {"norm": "batch_norm", "act": "elu"}, True),
    ("gat", {"act_first": True, "act": "tanh"}, True), ("sage", {"jk": "cat"}, False),
    ("gcn", {"improved": True}, False), ("gcn", {"norm": "layer_norm"}, False)])   # PyG's LayerNorm: whole batch
def test_built_ins_with_model_kwargs_equal_pyg(kind, kwargs, blocks):
    """``model_kwargs`` reach PyG's constructor; what the block path cannot compute runs whole (PyG's forward)."""
    csr, x = LocalCSR.from_numpy(*messy_graph()), features()
    batch = NeighborSampler(csr, [4, 3], generator=torch.Generator().manual_seed(6)).sample(torch.arange(0, 900, 9))
    torch.manual_seed(0)
    model = build_model(kind, **SIZES, num_layers=2, **kwargs).eval()
    assert is_block_model(model) == blocks
    with torch.no_grad():
        whole = model(x[batch.n_id], batch.edge_index)[:batch.batch_size]
        assert torch.allclose(seed_logits(model, x[batch.n_id], batch), whole, atol=1e-5)


@pytest.mark.parametrize("kind", list(PYG))
def test_block_gradients_equal_the_whole_batch(kind):
    csr, x = LocalCSR.from_numpy(*messy_graph()), features()
    batch = NeighborSampler(csr, [4, 3], generator=torch.Generator().manual_seed(2)).sample(torch.arange(0, 900, 9))
    torch.manual_seed(0)
    model = build_model(kind, **{**SIZES, "dropout": 0.0}, num_layers=2).train()
    twin = pyg_twin(kind, model, 2).train()
    seed_logits(model, x[batch.n_id], batch).square().sum().backward()
    twin(x[batch.n_id], batch.edge_index)[:batch.batch_size].square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), (kind, name)


@pytest.mark.parametrize("kind", list(PYG))
def test_dropout_scale_reaches_outputs_and_gradients(kind, monkeypatch):
    """With every unit kept, training-mode dropout (p = 0.5) is ``2 * relu``: the block path, which applies the
    1 / (1 - p) inside the next layer's GEMM, must equal PyG's model with that activation, gradients included."""
    monkeypatch.setattr("stages.train.models.blocks._keep_mask", lambda h, p: torch.ones_like(h))
    csr, x = LocalCSR.from_numpy(*messy_graph()), features()
    batch = NeighborSampler(csr, [4, 3], generator=torch.Generator().manual_seed(7)).sample(torch.arange(0, 900, 9))
    torch.manual_seed(0)
    model = build_model(kind, **SIZES, num_layers=2).train()
    extra = {"heads": 4} if kind == "gat" else {}
    twin = PYG[kind](SIZES["in_channels"], SIZES["hidden"], 2, SIZES["out_channels"], dropout=0.0,
                     act=lambda t: 2 * torch.relu(t), **extra)
    twin.load_state_dict(model.state_dict())
    for m in (model, twin):                       # GAT's attention dropout draws its own masks
        for conv in m.convs:
            if kind == "gat":
                conv.dropout = 0.0
    out = seed_logits(model, x[batch.n_id], batch)
    ref = twin(x[batch.n_id], batch.edge_index)[:batch.batch_size]
    assert torch.allclose(out, ref, atol=1e-5)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-4, rtol=1e-4), (kind, name)


def test_targets_out_of_order_give_the_same_blocks():
    """The distributed sampler groups each hop's edges by owner rank, not by target: blocks sort them."""
    csr, x = LocalCSR.from_numpy(*messy_graph()), features()
    batch = NeighborSampler(csr, [4, 3], generator=torch.Generator().manual_seed(3)).sample(torch.arange(0, 900, 9))
    shuffled = batch.clone()
    ends = np.cumsum([0, *batch.num_sampled_edges])
    perm = torch.cat([lo + torch.randperm(hi - lo, generator=torch.Generator().manual_seed(4))
                      for lo, hi in zip(ends[:-1], ends[1:])])
    shuffled.edge_index = batch.edge_index[:, perm]
    assert batch.edges_by_target, "one CSR's hops come grouped by target"
    shuffled.edges_by_target = False   # as the distributed sampler's batches say
    for kind in MODELS:
        torch.manual_seed(0)
        model = build_model(kind, **SIZES, num_layers=2).eval()
        with torch.no_grad():
            assert torch.allclose(seed_logits(model, x[batch.n_id], shuffled),
                                  seed_logits(model, x[batch.n_id], batch), atol=1e-5), kind


@pytest.mark.parametrize("kind, true_deg", [("sage", False), ("gcn", False), ("gcn", True)])
def test_targets_anywhere_among_the_sources_equal_targets_first(kind, true_deg):
    """``dst_start``: a block whose targets are sources [7, 12) (layer-wise inference's chunk of a layer matrix)
    equals the same block with those rows moved to the front, outputs and gradients."""
    torch.manual_seed(3)
    num_src, ds, t = 20, 7, 5
    src_pos = torch.randint(0, num_src, (40,))
    dst_pos = torch.sort(torch.randint(0, t, (40,))).values
    h = torch.randn(num_src, SIZES["in_channels"], requires_grad=True)
    deg = torch.randint(1, 9, (num_src,)).float() if true_deg else None
    order = torch.cat([torch.arange(ds, ds + t), torch.arange(0, ds), torch.arange(ds + t, num_src)])
    new_pos = torch.empty_like(order)
    new_pos[order] = torch.arange(num_src)                   # old source position -> position with targets first
    model = build_model(kind, num_layers=1, **SIZES).eval()
    conv = model.convs[0]
    anywhere = BatchGraph(torch.stack([src_pos, dst_pos]), num_src, t, deg, dst_start=ds)
    first = BatchGraph(torch.stack([new_pos[src_pos], dst_pos]), num_src, t,
                       None if deg is None else deg[order])
    out_a = model.block_step(conv, h, Block(num_src, t, 40, anywhere), 1.0)
    grad_a, = torch.autograd.grad(out_a.square().sum(), h)
    h_first = h[order]
    out_f = model.block_step(conv, h_first, Block(num_src, t, 40, first), 1.0)
    grad_f, = torch.autograd.grad(out_f.square().sum(), h)
    torch.testing.assert_close(out_a, out_f)
    torch.testing.assert_close(grad_a, grad_f)


def test_block_sizes_follow_the_hops():
    csr = LocalCSR.from_numpy(*power_law_graph())
    batch = NeighborSampler(csr, [5, 3, 2], generator=torch.Generator().manual_seed(0)).sample(torch.arange(20))
    nodes, edges = np.cumsum(batch.num_sampled_nodes), np.cumsum(batch.num_sampled_edges)
    blocks = make_blocks(batch, 3)
    assert [(b.num_dst, b.num_src, b.num_edges) for b in blocks] == \
        [(nodes[2], nodes[3], edges[2]), (nodes[1], nodes[2], edges[1]), (nodes[0], nodes[1], edges[0])]
    assert all(int(b.edge_index[0].max()) < b.num_src and int(b.edge_index[1].max()) < b.num_dst for b in blocks)
    assert make_blocks(batch, 2)[0].num_src == nodes[2], "a shallower model uses the first hops"
    with pytest.raises(ValueError, match="needs 1 to 3 sampled hops"):
        make_blocks(batch, 4)


def test_gcn_with_true_degrees_and_every_neighbour_is_full_graph_gcn():
    indptr, indices = power_law_graph()
    x, deg = features(), true_degrees(indptr)
    sampler = NeighborSampler(LocalCSR.from_numpy(indptr, indices), [-1, -1], generator=torch.Generator())
    torch.manual_seed(0)
    model = build_model("gcn", **SIZES, num_layers=2).eval()
    assert needs_degrees(model) and not needs_degrees(build_model("sage", **SIZES, num_layers=2))
    full = full_graph_gcn(model, 2, x)
    seed_gid = torch.tensor([3, 10, 500, 1200, NUM_NODES - 1])   # the hub, ordinary nodes, an isolated one
    batch = sampler.sample(seed_gid)
    with torch.no_grad():
        subgraph = seed_logits(model, x[batch.n_id], batch)
        batch.deg = deg[batch.n_id]
        sampled = seed_logits(model, x[batch.n_id], batch)
    assert torch.allclose(sampled, full[seed_gid], atol=1e-5)
    assert not torch.allclose(subgraph, full[seed_gid], atol=1e-3), "the subgraph's degrees are not GCN's"


def test_sampled_gcn_is_an_unbiased_estimate_of_the_full_aggregation():
    """One linear GCN layer: the mean over many sampled batches (fanout 3) converges to full-graph GCN."""
    indptr, indices = power_law_graph()
    x, deg = features(), true_degrees(indptr)
    sampler = NeighborSampler(LocalCSR.from_numpy(indptr, indices), [3], generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    model = build_model("gcn", **SIZES, num_layers=1).eval()
    seed_gid = torch.nonzero(deg > 6).view(-1)[:5]   # gid 3 (the hub, degree 301) and ordinary ones above 5
    assert 3 in seed_gid.tolist()
    full = full_graph_gcn(model, 1, x)[seed_gid]
    true_runs, subgraph_runs = [], []
    with torch.no_grad():
        for _ in range(600):
            batch = sampler.sample(seed_gid)
            subgraph_runs.append(seed_logits(model, x[batch.n_id], batch))
            true_runs.append(seed_logits(model, x[batch.n_id], with_deg(batch, deg)))
    for runs, unbiased in ((torch.stack(true_runs), True), (torch.stack(subgraph_runs), False)):
        z = (runs.mean(0) - full).abs() / (runs.std(0) / len(runs) ** 0.5 + 1e-6)
        assert bool((z < 4.5).all()) == unbiased, (unbiased, z)


def with_deg(batch, deg):
    batch.deg = deg[batch.n_id]
    return batch


def test_gcn_with_true_degrees_through_the_distributed_sampler(tmp_path):
    """2 gloo ranks, fanout -1: remote nodes' degrees come from their owners; outputs are full-graph GCN's."""
    x = features()
    torch.manual_seed(0)
    model = build_model("gcn", **GCN_SIZES).eval()
    full = full_graph_gcn(model, GCN_SIZES["num_layers"], x)
    deg = true_degrees(power_law_graph()[0])
    ranks = spawn_ranks(worker, (model.state_dict(), x), tmp_path, WORLD_SIZE, TIMEOUT_S)
    for rank, out in enumerate(ranks):
        assert len(out) == len(seeds_of(rank))
        for seed_gid, n_id, batch_deg, logits in out:
            assert torch.equal(batch_deg, deg[n_id]), "every position's true degree, remote ones included"
            assert torch.allclose(logits, full[seed_gid], atol=1e-5)


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_relu_dropout_keeps_one_minus_p_and_passes_gradients_where_kept(p):
    torch.manual_seed(0)
    keep = _keep_mask(torch.empty(1000, 400), p)
    assert set(keep.unique().tolist()) == {0.0, 1.0}
    assert abs(float(keep.mean()) - (1 - p)) < 0.005                 # 400 k draws: std 0.0008
    h = torch.randn(300, 50, requires_grad=True)
    z, scale = relu_dropout(h.clone(), p, training=True)
    assert scale == pytest.approx(1 / (1 - p))
    kept = z != 0
    assert torch.equal(z[kept], h.detach()[kept]) and bool((h.detach()[kept] > 0).all())
    assert abs(float(kept.sum()) / float((h > 0).sum()) - (1 - p)) < 0.05   # of the ~7 500 positive entries
    z.sum().backward()
    assert torch.equal(h.grad, kept.float())
    z_eval, scale_eval = relu_dropout(h, p, training=False)
    assert scale_eval == 1.0 and torch.equal(z_eval, torch.relu(h))


@pytest.mark.parametrize("kind", MODELS)
def test_bfloat16_precision_stays_close_and_returns_float32_logits(kind):
    csr, x = LocalCSR.from_numpy(*power_law_graph()), features()
    batch = NeighborSampler(csr, [5, 3], generator=torch.Generator().manual_seed(0)).sample(torch.arange(0, 900, 9))
    torch.manual_seed(0)
    model = build_model(kind, **SIZES, num_layers=2).train()
    with torch.no_grad():
        full = seed_logits(model.eval(), x[batch.n_id], batch)
        half = seed_logits(model, x[batch.n_id], batch, precision="bfloat16")
    assert half.dtype == torch.float32 and not torch.equal(half, full), "the products ran in bfloat16"
    assert torch.allclose(half, full, atol=0.05 * float(full.abs().max())), kind
    seed_logits(model.train(), x[batch.n_id], batch, precision="bfloat16").sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def _typed_graph(num_nodes: int = 300, num_types: int = 3, seed: int = 0) -> LocalCSR:
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 12, num_nodes * num_types)
    indptr = np.concatenate([[0], np.cumsum(deg)])
    return LocalCSR.from_numpy(indptr, rng.integers(0, num_nodes, int(indptr[-1])), num_edge_types=num_types)


@pytest.mark.parametrize(("typed", "fanouts"), [(False, [4, 3]), (False, [-1, 2, 5]), (True, [2, 3]),
                                                (True, [(2, 0, 5), (1, 1, 1)])])
def test_a_batch_that_says_its_edges_are_by_target_has_them_so(typed, fanouts):
    """``edges_by_target`` lets the blocks skip their two layout checks (host syncs on a GPU): every batch that
    says it must have its (target, edge type) keys non-decreasing and each hop's edges on its frontier's targets,
    and the blocks built with and without trusting it are the same."""
    csr = _typed_graph() if typed else LocalCSR.from_numpy(*messy_graph())
    sampler = NeighborSampler(csr, fanouts, generator=torch.Generator().manual_seed(5))
    for seed_gid in (torch.arange(0, 300, 7), torch.tensor([11]), torch.tensor([], dtype=torch.long)):
        batch = sampler.sample(seed_gid)
        assert batch.edges_by_target
        dst_pos = batch.edge_index[1]
        key_pos = dst_pos if not typed else dst_pos * csr.num_edge_types + batch.edge_type
        assert bool((key_pos[1:] >= key_pos[:-1]).all())
        nodes = np.cumsum([0, *batch.num_sampled_nodes])
        edges = np.cumsum([0, *batch.num_sampled_edges])
        for k in range(len(fanouts)):   # hop k + 1's edges point into hop k's new nodes
            hop_dst = dst_pos[edges[k]:edges[k + 1]]
            assert bool(((hop_dst >= nodes[k]) & (hop_dst < nodes[k + 1])).all())
        if not typed:
            trusted = make_blocks(batch, len(fanouts))
            batch.edges_by_target = False
            checked = make_blocks(batch, len(fanouts))
            assert torch.equal(trusted[0].graph.crow, checked[0].graph.crow)
            assert torch.equal(trusted[0].graph.col, checked[0].graph.col)
