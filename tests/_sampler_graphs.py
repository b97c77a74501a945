"""Small test graphs for the sampler tests (numpy only; no partitioner): incoming CSR in gids."""

from __future__ import annotations

import numpy as np
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler

NUM_NODES = 1500
BOUNDS = [0, 700, NUM_NODES]     # two contiguous partitions of uneven size


def power_law_graph(num_nodes: int = NUM_NODES, avg_degree: float = 8.0, seed: int = 0,
                    num_isolated: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Undirected Chung-Lu graph with Pareto degrees, no self-loops or duplicates, rows sorted.

    The last ``num_isolated`` gids get no edges (degree-0 targets); gid 3 is a hub with ~300 neighbours, for the
    uniformity tests.
    """
    rng = np.random.default_rng(seed)
    live = num_nodes - num_isolated
    weight = (1.0 - rng.random(live)) ** (-1.0 / 1.2)
    cdf = np.cumsum(weight / weight.sum())
    half = int(live * avg_degree / 2)
    u_gid = np.minimum(np.searchsorted(cdf, rng.random(half)), live - 1)
    v_gid = np.minimum(np.searchsorted(cdf, rng.random(half)), live - 1)
    hub_src = rng.choice(live, 300, replace=False)
    u_gid = np.concatenate([u_gid, hub_src])
    v_gid = np.concatenate([v_gid, np.full(hub_src.shape, 3)])
    keep = u_gid != v_gid
    u_gid, v_gid = u_gid[keep], v_gid[keep]
    key = np.unique(np.concatenate([v_gid * num_nodes + u_gid, u_gid * num_nodes + v_gid]))
    dst_gid, src_gid = np.divmod(key, num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst_gid, minlength=num_nodes), out=indptr[1:])
    return indptr, src_gid.astype(np.int64)


def edge_keys(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Sorted ``dst_gid * N + src_gid`` of every edge, for membership tests with ``np.isin``."""
    num_nodes = indptr.shape[0] - 1
    dst_gid = np.repeat(np.arange(num_nodes), np.diff(indptr))
    return np.sort(dst_gid * num_nodes + indices)


def split_csr(indptr: np.ndarray, indices: np.ndarray, bounds: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per-partition (indptr over lids, indices in gids), as the partition stage writes them."""
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        parts.append((indptr[lo:hi + 1] - indptr[lo], indices[indptr[lo]:indptr[hi]].copy()))
    return parts


def expected_counts(deg: np.ndarray, fanout: int, replace: bool) -> np.ndarray:
    """Neighbours a target of degree ``deg`` must get: all for -1, exactly ``fanout`` (if any) with replacement,
    else ``min(deg, fanout)``."""
    if fanout == -1:
        return deg
    if replace:
        return np.where(deg > 0, fanout, 0)
    return np.minimum(deg, fanout)


def check_batch(batch, seed_gid: torch.Tensor, graph: tuple[np.ndarray, np.ndarray], *,
                fanouts: list[int] | None = None, replace: bool = False) -> None:
    """Asserts the documented ID spaces and PyG fields of a sampled batch; with ``fanouts``, also that every
    frontier node of hop h got exactly ``min(deg, fanout)`` distinct in-edges (``fanout`` if ``replace``)."""
    indptr, indices = graph
    num_nodes = indptr.shape[0] - 1
    n_id, edge_index = batch.n_id, batch.edge_index
    assert batch.batch_size == seed_gid.numel() and torch.equal(n_id[:batch.batch_size], seed_gid)
    assert torch.unique(n_id).numel() == n_id.numel() == batch.num_nodes
    assert n_id.numel() == 0 or (int(n_id.min()) >= 0 and int(n_id.max()) < num_nodes)
    assert edge_index.shape[0] == 2 and edge_index.dtype == torch.long
    assert edge_index.numel() == 0 or (int(edge_index.min()) >= 0 and int(edge_index.max()) < n_id.numel())
    assert sum(batch.num_sampled_nodes) == n_id.numel() and batch.num_sampled_nodes[0] == batch.batch_size
    assert sum(batch.num_sampled_edges) == edge_index.shape[1]
    src_gid, dst_gid = n_id[edge_index[0]].numpy(), n_id[edge_index[1]].numpy()
    keys = dst_gid * num_nodes + src_gid
    assert np.isin(keys, edge_keys(indptr, indices)).all(), "a sampled edge is not in the graph"
    if not replace:
        assert np.unique(keys).shape == keys.shape, "an edge was sampled twice"
    # hop h's edges point into the nodes first reached at hop h - 1 (what hop-wise trimming relies on)
    node_end = np.cumsum(batch.num_sampled_nodes)
    edge_end = np.cumsum([0] + batch.num_sampled_edges)
    deg = np.diff(indptr)
    for hop in range(len(batch.num_sampled_edges)):
        lo = 0 if hop == 0 else node_end[hop - 1]
        dst_pos = edge_index[1, edge_end[hop]:edge_end[hop + 1]].numpy()
        src_pos = edge_index[0, edge_end[hop]:edge_end[hop + 1]].numpy()
        assert dst_pos.size == 0 or (dst_pos.min() >= lo and dst_pos.max() < node_end[hop])
        assert src_pos.size == 0 or src_pos.max() < node_end[hop + 1]
        if fanouts is not None:
            expected = expected_counts(deg[n_id[lo:node_end[hop]].numpy()], fanouts[hop], replace)
            got = np.bincount(dst_pos - lo, minlength=node_end[hop] - lo)
            np.testing.assert_array_equal(got, expected)


def class_graph(n: int = 600, classes: int = 3, seed: int = 0):
    """Nodes link mostly within their class; features are a weak class signal: neighbours help."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    src, dst = [], []
    for v in range(n):
        same = np.flatnonzero(y == y[v])
        nbrs = np.concatenate([rng.choice(same, 6), rng.integers(0, n, 2)])
        src += nbrs.tolist()
        dst += [v] * len(nbrs)
    order = np.lexsort((src, dst))
    src, dst = np.array(src)[order], np.array(dst)[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    x = (np.eye(classes)[y] * 0.6 + rng.normal(size=(n, classes))).astype(np.float32)
    return LocalCSR.from_numpy(indptr, src), torch.from_numpy(x), torch.from_numpy(y)


def assert_same_batches(csr_a: LocalCSR, csr_b: LocalCSR, device: torch.device) -> None:
    """The same seeds (every 37th node of the graph, from three offsets) and generator seed sample the same
    batches from ``csr_a`` and ``csr_b`` on ``device``."""
    batches = []
    for csr in (csr_a, csr_b):
        smp = NeighborSampler(csr, [15, 10, 5], generator=torch.Generator(device=device).manual_seed(3))
        batches.append([smp.sample(torch.arange(k, csr.num_nodes, 37, device=device)) for k in range(3)])
    for in_a, in_b in zip(*batches):
        assert torch.equal(in_a.n_id, in_b.n_id) and torch.equal(in_a.edge_index, in_b.edge_index)

