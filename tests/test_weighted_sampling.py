"""Weighted neighbour sampling (``stages.runtime.sampling.weighted``): empirical frequencies against the exact
probabilities.

One target row of weights ``W`` (a zero among them) is sampled ``N`` times at once (the target repeated), so each
frequency is a mean of N independent indicators: it must lie within ``Z`` standard errors ``sqrt(p (1 - p) / N)``
of its probability (Z = 5: a false alarm about once in 3.5 million per value).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.uniform import sample_edges_with_counts

W = [1.0, 0.0, 2.0, 3.0, 4.0]   # the weights of node 1's in-edges (sources 0, 2, 3, 4, 5)
N = 20_000
Z = 5.0


def _csr() -> LocalCSR:
    """Node 0 has no in-edge, node 1 the five of ``W``, node 2 one of weight 0 (from 0)."""
    indptr = np.array([0, 0, 5, 6])
    indices = np.array([0, 2, 3, 4, 5, 0])
    return LocalCSR.from_numpy(indptr, indices).with_edge_weight(torch.tensor([*W, 0.0]))


def _within(freq: np.ndarray, prob: np.ndarray, n: int) -> None:
    tol = Z * np.sqrt(prob * (1 - prob) / n)
    assert np.all(np.abs(freq - prob) <= tol + 1e-12), (freq, prob, tol)


def _frequencies(fanout: int, replace: bool) -> tuple[np.ndarray, torch.Tensor]:
    count, row_pos, edge_idx = sample_edges_with_counts(_csr(), torch.ones(N, dtype=torch.long), fanout,
                                                        replace=replace, generator=torch.Generator().manual_seed(0))
    return np.bincount(edge_idx.numpy(), minlength=5)[:5], count


@pytest.mark.parametrize("replace", [True, False])
def test_one_draw_is_proportional_to_the_weights(replace):
    hits, count = _frequencies(1, replace)
    assert torch.equal(count, torch.ones(N, dtype=torch.long))
    _within(hits / N, np.array(W) / sum(W), N)


def test_draws_with_replacement_are_each_proportional_to_the_weights():
    hits, count = _frequencies(3, True)
    assert torch.equal(count, torch.full((N,), 3))
    _within(hits / (3 * N), np.array(W) / sum(W), 3 * N)


def test_two_without_replacement_follow_successive_weighted_draws():
    """Inclusion probability of each edge in a 2-subset: the sum over ordered pairs (i, j) of w_i / W * w_j /
    (W - w_i), the law of drawing one edge at a time in proportion to the weights of those left."""
    hits, count = _frequencies(2, False)
    total = sum(W)
    incl = np.zeros(5)
    for i, j in itertools.permutations(range(5), 2):
        p = W[i] / total * W[j] / (total - W[i])
        incl[i] += p
        incl[j] += p
    assert torch.equal(count, torch.full((N,), 2))
    _within(hits / N, incl, N)


@pytest.mark.parametrize("replace", [True, False])
def test_zero_weight_edges_and_rows_are_never_sampled(replace):
    count, row_pos, edge_idx = sample_edges_with_counts(_csr(), torch.tensor([0, 1, 2]), 10, replace=replace,
                                                        generator=torch.Generator().manual_seed(1))
    assert count.tolist() == ([0, 10, 0] if replace else [0, 4, 0])   # node 1 has 4 edges of positive weight
    assert 1 not in edge_idx.tolist() and 5 not in edge_idx.tolist() and set(row_pos.tolist()) == {1}
    all_count, _, all_edges = sample_edges_with_counts(_csr(), torch.tensor([1, 2]), -1)
    assert all_count.tolist() == [4, 0] and sorted(all_edges.tolist()) == [0, 2, 3, 4]


def test_weights_must_be_finite_and_non_negative():
    csr = LocalCSR.from_numpy(np.array([0, 1, 2]), np.array([1, 0]))
    for bad in ([1.0, -0.5], [1.0, float("nan")], [1.0]):
        with pytest.raises(ValueError, match="edge weights must be 2 finite values >= 0"):
            csr.with_edge_weight(torch.tensor(bad))

