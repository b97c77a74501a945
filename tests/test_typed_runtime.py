"""Typed sampling, batches, sharded embeddings and relational models, against references (docs/design.md §4, §6).

The distributed cases run on 2 spawned gloo ranks (``tests._typed_worker``), in one spawn for all of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.fanouts import hop_fanouts
from stages.runtime.sampling.sampler import NeighborSampler
from stages.runtime.sharded_embedding import ShardedEmbedding
from stages.runtime.typed_batch import set_types, to_hetero_data
from stages.train.models.blocks import BatchGraph, Block
from stages.train.models.model import build_model, seed_logits
from stages.train.models.typed_model import TypedInput
from storage.graph import Graph
from tests._spawn import spawn_ranks
from tests._typed_worker import (
    EMB_BOUNDS,
    EMB_DIM,
    EMB_STEPS,
    TIMEOUT_S,
    WORLD_SIZE,
    emb_draws,
    membership_queries,
    membership_truth,
    per_type_fanout,
    typed_graph,
    worker,
)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def graph() -> Graph:
    return typed_graph()


@pytest.fixture(scope="module")
def ranks_out(tmp_path_factory):
    return spawn_ranks(worker, (), tmp_path_factory.mktemp("typed"), WORLD_SIZE, TIMEOUT_S)


def whole_csr(graph: Graph) -> LocalCSR:
    return LocalCSR.from_numpy(graph.indptr, graph.indices, num_edge_types=graph.schema.num_edge_types)


def typed_in_edges(graph: Graph, dst_gid: np.ndarray) -> set[tuple[int, int, int]]:
    """Every (src, dst, edge type) into ``dst_gid``, read off the (node, edge type) rows."""
    r = graph.schema.num_edge_types
    out = set()
    for v in dst_gid.tolist():
        for e in range(r):
            lo, hi = graph.indptr[v * r + e], graph.indptr[v * r + e + 1]
            out.update((int(u), v, e) for u in graph.indices[lo:hi])
    return out


def batch_edges(batch) -> list[tuple[int, int, int]]:
    n_id, ei = batch.n_id, batch.edge_index
    return list(zip(n_id[ei[0]].tolist(), n_id[ei[1]].tolist(), batch.edge_type.tolist()))


def hop_edges(batch, hop: int) -> list[tuple[int, int, int]]:
    lo = sum(batch.num_sampled_edges[:hop])
    return batch_edges(batch)[lo:lo + batch.num_sampled_edges[hop]]


def test_full_fanout_gives_every_typed_in_edge(graph):
    seed_gid = torch.arange(0, graph.schema.num_nodes, 97)
    batch = NeighborSampler(whole_csr(graph), [-1]).sample(seed_gid)
    edges = batch_edges(batch)
    assert len(edges) == len(set(edges)) and set(edges) == typed_in_edges(graph, seed_gid.numpy())
    for src, _, e in edges:   # each edge type's source is of its src node type
        et = graph.schema.edge_types[e]
        assert graph.schema.node_types[int(graph.schema.node_type_of_orig()[src])].name == et.src


def test_a_fanout_caps_each_edge_type_of_each_target(graph):
    seed_gid = torch.arange(0, graph.schema.num_nodes, 11)
    batch = NeighborSampler(whole_csr(graph), [3], generator=torch.Generator().manual_seed(0)).sample(seed_gid)
    edges = batch_edges(batch)
    assert set(edges) <= typed_in_edges(graph, seed_gid.numpy()) and len(edges) == len(set(edges))
    r = graph.schema.num_edge_types
    got = {}
    for _, dst, e in edges:
        got[(dst, e)] = got.get((dst, e), 0) + 1
    for v in seed_gid.tolist():
        for e in range(r):
            deg = int(graph.indptr[v * r + e + 1] - graph.indptr[v * r + e])
            assert got.get((v, e), 0) == min(deg, 3), (v, e)


def typed_counts(edges: list[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
    got: dict[tuple[int, int], int] = {}
    for _, dst, e in edges:
        got[(dst, e)] = got.get((dst, e), 0) + 1
    return got


def check_per_type_hop(graph: Graph, edges: list[tuple[int, int, int]], seed_gid: list[int],
                       fanout: tuple[int, ...]) -> None:
    """Each (target, edge type) got min(degree, its type's fanout) distinct true in-edges (0: none)."""
    assert set(edges) <= typed_in_edges(graph, np.array(seed_gid)) and len(edges) == len(set(edges))
    got, r = typed_counts(edges), graph.schema.num_edge_types
    for v in seed_gid:
        for e in range(r):
            deg = int(graph.indptr[v * r + e + 1] - graph.indptr[v * r + e])
            assert got.get((v, e), 0) == (deg if fanout[e] == -1 else min(deg, fanout[e])), (v, e)


def test_a_fanout_per_edge_type(graph):
    """``hop_fanouts`` -> one count per edge type per hop: each type capped by its own, 0 = not sampled; the hop's
    edges still grouped by target then type (the distributed sampler routes answers by target); the same count
    for every type draws what the scalar fanout draws."""
    seed_gid = torch.arange(0, graph.schema.num_nodes, 11)
    fanout = per_type_fanout(graph)
    batch = NeighborSampler(whole_csr(graph), [fanout], generator=torch.Generator().manual_seed(0)).sample(seed_gid)
    check_per_type_hop(graph, batch_edges(batch), seed_gid.tolist(), fanout)
    key = batch.edge_index[1] * graph.schema.num_edge_types + batch.edge_type
    assert bool((key[1:] >= key[:-1]).all())
    same = tuple([3] * graph.schema.num_edge_types)
    a, b = (NeighborSampler(whole_csr(graph), [f], generator=torch.Generator().manual_seed(0)).sample(seed_gid)
            for f in (same, 3))
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.edge_type, b.edge_type)


def test_a_zero_fanout_on_a_graph_of_one_edge_type():
    """``edge_fanouts={"edge": [5, 0]}`` on a homogeneous graph: the second hop samples nothing, and the batch has
    no edge types (as with a scalar fanout), so its blocks build."""
    from tests._sampler_graphs import power_law_graph

    csr = LocalCSR.from_numpy(*power_law_graph())
    fanouts = hop_fanouts([5, 5], {"edge": [5, 0]}, [("node", "edge", "node")])
    batch = NeighborSampler(csr, fanouts, generator=torch.Generator().manual_seed(0)).sample(torch.arange(20))
    assert batch.num_sampled_edges[1] == 0 and batch.num_sampled_edges[0] > 0 and "edge_type" not in batch
    plain = NeighborSampler(csr, [5], generator=torch.Generator().manual_seed(0)).sample(torch.arange(20))
    assert torch.equal(batch.edge_index, plain.edge_index)


def test_hop_fanouts_name_edge_types_by_key_or_relation(graph):
    types = [e.as_tuple() for e in graph.schema.edge_types]
    cites = next(i for i, e in enumerate(types) if e[1] == "cites")
    hops = hop_fanouts([10, 5], {"cites": [4, 0]}, types)
    assert [h[cites] for h in hops] == [4, 0] and all(h[e] == f for h, f in zip(hops, [10, 5])
                                                      for e in range(len(types)) if e != cites)
    assert hop_fanouts([10, 5], {"paper___cites___paper": [4, 0]}, types) == hops
    assert hop_fanouts([10, 5], {}, types) == [10, 5]
    with pytest.raises(ValueError, match="no edge type of this graph has that key or relation"):
        hop_fanouts([10, 5], {"likes": [1, 1]}, types)
    with pytest.raises(ValueError, match="has 1 values, fanouts 2"):
        hop_fanouts([10, 5], {"cites": [1]}, types)


def test_two_ranks_sample_what_one_samples(ranks_out, graph):
    for rank, out in enumerate(ranks_out):
        full = out["full"]
        seed_gid = full.n_id[:full.batch_size]
        single = NeighborSampler(whole_csr(graph), [-1, -1]).sample(seed_gid)
        assert set(batch_edges(full)) == set(batch_edges(single)), rank
        assert set(full.n_id.tolist()) == set(single.n_id.tolist())
        assert full.num_sampled_edges == single.num_sampled_edges
        sampled = out["sampled"]
        assert set(batch_edges(sampled)) <= typed_in_edges(graph, sampled.n_id.numpy())
        assert len(hop_edges(sampled, 0)) == sum(min(3, int(d)) for d in np.diff(graph.indptr)[
            np.add.outer(seed_gid.numpy() * graph.schema.num_edge_types,
                         np.arange(graph.schema.num_edge_types)).ravel()])
        assert out["empty"].n_id.numel() == 0 and out["empty"].edge_type.numel() == 0
        per_type = out["per_type"]   # the distributed sampler with a fanout per edge type
        check_per_type_hop(graph, hop_edges(per_type, 0), seed_gid.tolist(), per_type_fanout(graph))


def test_checkpoint_parts_survive_ranks_moving_between_nodes_and_a_lost_node(ranks_out):
    for rank, out in enumerate(ranks_out):   # each directory held only the other rank's part
        assert out["moved_part"]["rank"] == rank and torch.equal(out["moved_part"]["rows"], torch.full((3,), rank))
        held, part = out["replicated_part"]   # two nodes: each part on both, and node 1's copy lost before resuming
        assert held == [0, 1] and part == {"rank": rank}


def test_edge_membership_asked_of_the_owners_on_two_ranks(ranks_out, graph):
    """Each rank asks half the pairs; every answer equals the whole graph's."""
    src, dst, edge_type = membership_queries(graph)
    want = membership_truth(graph, src, dst, edge_type)
    assert bool(want[:200].all()) and not bool(want[200:].all())
    for rank, out in enumerate(ranks_out):
        assert torch.equal(out["membership"], want[rank::2]), rank


def replay_on_one_rank() -> ShardedEmbedding:
    """The 2-rank run's gathers and losses in one process: the loss is the ranks' mean (DDP's averaging)."""
    emb = ShardedEmbedding([0, EMB_BOUNDS[-1]], EMB_DIM, lr=0.1, seed=3, node_type=1)
    for step in range(EMB_STEPS):
        loss = sum((emb.gather(tgid) * coef).sum() for tgid, coef in (emb_draws(step, r) for r in range(WORLD_SIZE)))
        (loss / WORLD_SIZE).backward()
        emb.step()
    return emb


def test_sharded_embeddings_on_two_ranks_equal_one(ranks_out):
    one = replay_on_one_rank()
    for rank, out in enumerate(ranks_out):
        lo, hi = EMB_BOUNDS[rank], EMB_BOUNDS[rank + 1]
        assert torch.equal(out["emb_initial"], ShardedEmbedding(
            [0, EMB_BOUNDS[-1]], EMB_DIM, lr=0.1, seed=3, node_type=1).weight.detach()[lo:hi]), "init by tgid"
        assert torch.allclose(out["emb_final"], one.weight.detach()[lo:hi], atol=1e-6)
        assert torch.equal(out["eval_rows"], torch.cat([o["emb_final"] for o in ranks_out]))


def test_a_rank_updates_exactly_the_rows_its_ranks_batches_touched(ranks_out):
    touched = torch.cat([o["touched"] for o in ranks_out])
    for rank, out in enumerate(ranks_out):
        lo, hi = EMB_BOUNDS[rank], EMB_BOUNDS[rank + 1]
        changed = torch.nonzero((out["emb_final"] != out["emb_initial"]).any(1)).squeeze(1) + lo
        own_touched = torch.unique(touched[(touched >= lo) & (touched < hi)])
        assert torch.equal(changed, own_touched)
        per_step = [torch.unique(torch.cat([emb_draws(s, r)[0] for r in range(WORLD_SIZE)])) for s in range(EMB_STEPS)]
        assert out["touched_rows"] == [int(((t >= lo) & (t < hi)).sum()) for t in per_step]


def test_embedding_state_round_trips():
    emb = replay_on_one_rank()
    again = ShardedEmbedding([0, EMB_BOUNDS[-1]], EMB_DIM, lr=0.1, seed=7, node_type=1)
    again.load_state_dict(emb.state_dict())
    for e in (emb, again):   # one more step each: same weights, same optimiser moments
        (e.gather(torch.arange(10)) ** 2).sum().backward()
        e.step()
    assert torch.equal(emb.weight, again.weight)
    with pytest.raises(ValueError, match="does not fit"):
        ShardedEmbedding([0, 60], EMB_DIM, lr=0.1, seed=0).load_state_dict(emb.state_dict())


def typed_batch(graph: Graph, fanouts: list):
    batch = NeighborSampler(whole_csr(graph), fanouts, generator=torch.Generator().manual_seed(5)).sample(
        torch.arange(0, graph.schema.num_nodes, 29))
    return set_types(batch, torch.from_numpy(graph.schema.node_type_of_orig().astype(np.int64))[batch.n_id],
                     graph.schema.num_edge_types)


@pytest.mark.parametrize("kind", ["rgcn", "rgat", "hgt"])
@pytest.mark.parametrize("fanouts", [[4, 3], [-1, 2]])
def test_relational_blocks_equal_pyg_on_the_whole_batch(graph, kind, fanouts):
    """Blocks (per-relation mean matrix, per-relation masks, HGT's per-block maps) against the whole-batch calls
    (PyG's own for rgcn and rgat; HGT's whole batch is one block of every node, checked against PyG below)."""
    batch = typed_batch(graph, fanouts)
    x = torch.randn((batch.num_nodes, 8), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model(kind, in_channels=8, hidden=8, out_channels=3, num_layers=len(fanouts), dropout=0.0,
                        schema=graph.schema, heads=2).train()
    out = seed_logits(model, x, batch)
    types = {"node_type": batch.node_type} if kind == "hgt" else {}
    whole = model(x, batch.edge_index, batch.edge_type, **types)[:batch.batch_size]
    assert torch.allclose(out, whole, atol=1e-5)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    whole.square().sum().backward()
    for g, p in zip(grads, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["rgcn", "rgat", "hgt"])
def test_batches_short_of_some_edge_types(graph, kind):
    """A batch that sampled only some edge types (here the first; then none) still has the schema's R relations
    in its blocks (``batch.num_relations``; PyG's ``Data.num_edge_types`` would count 1, then fail on no edge)."""
    r = graph.schema.num_edge_types
    torch.manual_seed(0)
    model = build_model(kind, in_channels=8, hidden=8, out_channels=3, num_layers=2, dropout=0.0,
                        schema=graph.schema, heads=2)
    for first in (-1, 0):
        batch = typed_batch(graph, [(first, *[0] * (r - 1)), (first, *[0] * (r - 1))])
        assert set(batch.edge_type.tolist()) == ({0} if first else set())
        x = torch.randn((batch.num_nodes, 8), generator=torch.Generator().manual_seed(0))
        types = {"node_type": batch.node_type} if kind == "hgt" else {}
        whole = model(x, batch.edge_index, batch.edge_type, **types)[:batch.batch_size]
        assert torch.allclose(seed_logits(model, x, batch), whole, atol=1e-5)


def test_hgt_layer_equals_pyg_hgtconv_on_the_hetero_data(graph):
    """One HGT layer on the typed batch's one layout equals PyG's ``HGTConv`` on its ``HeteroData`` view (every
    type of this graph is some edge type's target, so PyG outputs them all), values and gradients."""
    batch = typed_batch(graph, [-1, 3])
    torch.manual_seed(0)
    model = build_model("hgt", in_channels=8, hidden=8, out_channels=3, num_layers=1, dropout=0.0,
                        schema=graph.schema, heads=2)
    for p in model.parameters():   # away from the init (unit skips and priors) so that every term counts
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn((batch.num_nodes, 8), generator=torch.Generator().manual_seed(1), requires_grad=True)
    conv = model.convs[0]
    n = batch.num_nodes
    block = Block(n, n, batch.edge_index.shape[1], BatchGraph(batch.edge_index, n, n, None, edge_type=batch.edge_type,
                                                           num_edge_types=graph.schema.num_edge_types,
                                                           node_type=batch.node_type))
    ours = model._conv(conv, x, block)
    data = to_hetero_data(batch, graph.schema, {t.name: x[batch.node_type == i]
                                                 for i, t in enumerate(graph.schema.node_types)})
    theirs = conv(data.x_dict, data.edge_index_dict)
    for i, t in enumerate(graph.schema.node_types):
        assert torch.allclose(ours[batch.node_type == i], theirs[t.name], atol=1e-5), t.name
    grad_ours = torch.autograd.grad(ours.square().sum(), list(conv.parameters()), allow_unused=True)
    grad_theirs = torch.autograd.grad(sum(v.square().sum() for v in theirs.values()), list(conv.parameters()),
                                      allow_unused=True)
    for a, b in zip(grad_ours, grad_theirs):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-4, rtol=1e-4))


def test_hetero_data_view_keeps_types_hops_and_edges(graph):
    batch = typed_batch(graph, [4, 3])
    x_dict = {t.name: torch.full((int((batch.node_type == i).sum()), 2), float(i))
              for i, t in enumerate(graph.schema.node_types)}
    data = to_hetero_data(batch, graph.schema, x_dict)
    type_of_orig = graph.schema.node_type_of_orig()
    edges = []
    for i, t in enumerate(graph.schema.node_types):
        store = data[t.name]
        assert (type_of_orig[store.n_id.numpy()] == i).all() and torch.equal(batch.n_id[store.batch_pos], store.n_id)
        assert sum(store.num_sampled_nodes) == store.num_nodes and torch.equal(store.x, x_dict[t.name])
    seed_type = batch.node_type[:batch.batch_size]
    for i, t in enumerate(graph.schema.node_types):   # the seeds of a type lead its nodes
        assert data[t.name].batch_size == int((seed_type == i).sum())
        assert torch.equal(data[t.name].batch_pos[:data[t.name].batch_size], torch.nonzero(seed_type == i).view(-1))
    for e, et in enumerate(graph.schema.edge_types):
        store = data[et.as_tuple()]
        src, dst = data[et.src].n_id[store.edge_index[0]], data[et.dst].n_id[store.edge_index[1]]
        edges += list(zip(src.tolist(), dst.tolist(), [e] * src.numel()))
        assert sum(store.num_sampled_edges) == store.edge_index.shape[1]
    assert sorted(edges) == sorted(batch_edges(batch))


def test_typed_input_puts_each_types_rows_at_its_positions():
    enc = TypedInput({"a": 3, "b": None}, hidden=4)
    node_type = torch.tensor([1, 0, 1, 0, 0])
    rows_b = torch.arange(8.0).view(2, 4)
    x_a = torch.randn(3, 3)
    h = enc({"a": x_a, "b": rows_b}, node_type)
    assert torch.equal(h[[0, 2]], rows_b) and torch.allclose(h[[1, 3, 4]], enc.lins["a"](x_a))
