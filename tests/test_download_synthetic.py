"""The synthetic generator: invariants, determinism, degree/homophily shape, learnability, parameter errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from stages.download.synthetic import generate_synthetic
from storage.errors import InputError
from storage.graph import SPLITS, Graph


def degrees(g: Graph) -> np.ndarray:
    return np.diff(g.indptr)


def edge_dst(g: Graph) -> np.ndarray:
    return np.repeat(np.arange(g.num_nodes), degrees(g))


def test_deterministic_for_a_seed() -> None:
    a = generate_synthetic(3000, 10, 8, 4, seed=7)
    b = generate_synthetic(3000, 10, 8, 4, seed=7)
    c = generate_synthetic(3000, 10, 8, 4, seed=8)
    for name in ("indptr", "indices", "x", "y"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for s in SPLITS:
        assert np.array_equal(a.splits[s], b.splits[s])
    assert not np.array_equal(a.indices, c.indices)
    assert not np.array_equal(a.y, c.y)
    assert a.source == "synthetic(seed=7)" and a.name == "synthetic" and not a.directed


def test_feature_width_does_not_change_graph_or_labels() -> None:
    # Separate random streams: sweeping num_features must compare models on the same graph.
    a = generate_synthetic(2000, 8, 4, 5, seed=1)
    b = generate_synthetic(2000, 8, 64, 5, seed=1)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.y, b.y)
    assert b.x.shape == (2000, 64) and b.x.dtype == np.float32


def test_canonical_undirected_graph() -> None:
    g = generate_synthetic(5000, 12, 4, 6, seed=0)
    adj = sp.csr_matrix((np.ones(g.num_edges), g.indices, g.indptr), shape=(g.num_nodes, g.num_nodes))
    assert (adj != adj.T).nnz == 0  # symmetric
    assert adj.diagonal().sum() == 0  # no self-loops
    assert adj.max() == 1  # no duplicates (csr_matrix would sum them)
    for v in range(0, g.num_nodes, 97):
        assert np.all(np.diff(g.indices[g.indptr[v]:g.indptr[v + 1]]) > 0)
    assert g.indptr.dtype == np.int64 and g.indices.dtype == np.int64 and g.y.dtype == np.int64
    assert g.y.min() >= 0 and g.y.max() < 6


@pytest.mark.parametrize(("n", "avg_degree", "classes"), [(3000, 10, 4), (20000, 20, 16), (2000, 60, 3)])
def test_edge_count_matches_avg_degree(n: int, avg_degree: float, classes: int) -> None:
    g = generate_synthetic(n, avg_degree, 4, classes, seed=3)
    assert g.num_edges / n == pytest.approx(avg_degree, rel=0.03)


def test_power_law_like_degrees_with_communities() -> None:
    g = generate_synthetic(20000, 20, 4, 10, seed=0)
    deg = degrees(g)
    mean = deg.mean()
    assert deg.max() > 8 * mean  # heavy tail: hubs
    assert np.median(deg) < 0.9 * mean  # right-skewed: most nodes below the mean
    assert 0.001 < np.mean(deg > 4 * mean) < 0.05
    dst = edge_dst(g)
    homophily = np.mean(g.y[g.indices] == g.y[dst])
    chance = np.sum((np.bincount(g.y) / g.num_nodes) ** 2)  # same-label rate of random edges
    assert homophily > 0.5 and homophily > 3 * chance
    assert homophily < 0.9  # not perfectly homophilous
    # Node ids are shuffled: id order must not reveal the community (labels of consecutive ids are unrelated).
    assert np.mean(g.y[1:] == g.y[:-1]) < 2 * chance


def test_split_sizes_and_disjointness() -> None:
    g = generate_synthetic(10000, 5, 4, 4, seed=0)
    assert [g.splits[s].shape[0] for s in SPLITS] == [800, 200, 9000]  # products-like default
    union = np.concatenate([g.splits[s] for s in SPLITS])
    assert np.unique(union).shape[0] == 10000
    for s in SPLITS:
        assert g.splits[s].dtype == np.int64 and np.all(np.diff(g.splits[s]) > 0)
    h = generate_synthetic(1001, 5, 4, 4, seed=0, split=(0.5, 0.5, 0.0))
    assert [h.splits[s].shape[0] for s in SPLITS] == [500, 501, 0]  # rounding never overshoots N


def _accuracy(model: torch.nn.Module, forward: object, g: Graph, epochs: int) -> float:
    """Full-batch training on the train split; accuracy on the valid split."""
    y = torch.from_numpy(g.y)
    train, valid = torch.from_numpy(g.splits["train"]), torch.from_numpy(g.splits["valid"])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(forward()[train], y[train]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return float((forward()[valid].argmax(1) == y[valid]).float().mean())


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # in torch_geometric
def test_gnn_beats_mlp_and_chance_but_not_perfect(one_torch_thread: object) -> None:
    """The generator's purpose: features help, neighbours help a lot more, and nothing gets near 100 %."""
    from torch_geometric.nn import SAGEConv

    classes, hidden, epochs = 8, 32, 50
    g = generate_synthetic(6000, 10, 32, classes, seed=0, split=(0.3, 0.2, 0.5))
    x = torch.from_numpy(g.x)
    edge_index = torch.stack([torch.from_numpy(g.indices), torch.from_numpy(edge_dst(g))])  # row 0 = source

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                              torch.nn.Linear(hidden, classes))
    mlp_acc = _accuracy(mlp, lambda: mlp(x), g, epochs)

    torch.manual_seed(0)
    sage = torch.nn.ModuleList([SAGEConv(32, hidden, aggr="mean"), SAGEConv(hidden, classes, aggr="mean")])

    def gnn() -> torch.Tensor:
        h = F.dropout(F.relu(sage[0](x, edge_index)), 0.5, training=sage.training)
        return sage[1](h, edge_index)

    gnn_acc = _accuracy(sage, gnn, g, epochs)
    majority = np.bincount(g.y[g.splits["valid"]]).max() / g.splits["valid"].shape[0]
    assert mlp_acc > max(1.5 / classes, majority + 0.1), (mlp_acc, majority)
    assert gnn_acc > mlp_acc + 0.10, (gnn_acc, mlp_acc)
    assert gnn_acc < 0.95, gnn_acc  # label noise caps it near 0.9


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_nodes": 1}, "num_nodes=1 is too small"),
    ({"avg_degree": 0}, "avg_degree=0 must be > 0"),
    ({"avg_degree": 200}, "exceeds num_nodes - 1 = 99"),
    ({"num_features": 0}, "num_features=0 must be >= 1"),
    ({"num_classes": 1}, "num_classes=1 must be between 2 and num_nodes=100"),
    ({"num_classes": 101}, "num_classes=101 must be between 2"),
    ({"split": (0.5, -0.1, 0.2)}, r"must be 3 fractions .* in \[0, 1\] summing to <= 1"),
    ({"split": (0.5, 0.4, 0.2)}, "summing to <= 1"),
    ({"split": (0.5, 0.5)}, "must be 3 fractions"),
    ({"split": (0.001, 0.1, 0.1)}, "gives no training node out of 100"),
])
def test_parameter_errors(kwargs: dict, match: str) -> None:
    params = {"num_nodes": 100, "avg_degree": 5.0, "num_features": 4, "num_classes": 3, "seed": 0, **kwargs}
    with pytest.raises(InputError, match=match) as err:
        generate_synthetic(**params)
    assert "\n" not in str(err.value)


def test_synthetic_link_is_reported_as_itself(tmp_path) -> None:
    """Its download headline said ``synthetic:``, the generator's name, not the dataset's."""
    from stages.download import stage as download
    from storage import ArtifactStore

    params = download.Params(dataset="synthetic-link", task="link", num_nodes=2000, avg_degree=8.0, num_features=4)
    manifest = download.run(ArtifactStore(tmp_path), params, {}, progress=False)
    assert download.report(manifest).headline.startswith("synthetic-link: 2,000 nodes, ")
    assert manifest.summary["source"] == "synthetic-link(seed=0)"
