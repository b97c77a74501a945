"""A synthetic, products-like node-classification graph: power-law degrees, communities, noisy labels/features.

The model is a degree-corrected stochastic block model (Chung-Lu style, with community structure):

- nodes fall into ``num_classes * COMMUNITIES_PER_CLASS`` communities; class sizes are mildly skewed;
- each node has a Pareto weight θ and emits ``Poisson(θ · scale)`` edges, so degrees follow a power law with mean
  ``avg_degree``;
- an edge's other end is drawn in proportion to θ, inside the emitter's community with probability ``P_INTRA``;
  otherwise, with probability ``P_NEAR``, in a nearby community (up to ``NEAR_WIDTH`` steps on a random ring of
  communities, like related product categories), else anywhere: homophilous but far from perfectly, and with
  the hierarchical locality of real graphs (without it every inter-community edge is random, METIS finds no
  coarse structure, and 3-hop samples spread over the whole graph);
- a label is its community's class, replaced by a random class with probability ``LABEL_NOISE``;
- features are the community's centroid plus isotropic Gaussian noise that dominates it: an MLP on features alone
  is clearly above chance but far from perfect, and averaging over neighbours (mostly same-community) removes much
  of the noise, so a GNN wins by a wide margin (checked in tests/test_download_synthetic.py).

Weight-proportional endpoints come from an "urn": ``np.repeat(node, stubs)`` lists each node as often as it emits
edges, and the urn is sorted by community, so a uniform position in the whole urn (or in one community's segment)
is a weight-proportional node (of that community). That costs one random gather per edge; a ``searchsorted`` on a
weight cumsum costs ~0.7 µs per query (cache misses) on the 2-vCPU benchmark machine of ``benchmarks/RESULTS.md``,
over a minute at products scale, and pairing shuffled stubs (a configuration model) ~15 s; the whole download
stage takes 31.3 s there (RESULTS.md [1/5], row "download").

With ``num_edge_features`` D > 0 every edge also carries D attributes: column 0 is 1.0 when its two ends have the
same label and 0.0 otherwise, the other columns N(0, 1) noise (one draw per undirected edge: a reversed edge has its
edge's attributes). An edge-blind model averages every sampled neighbour; an edge-aware one (GAT with ``edge_dim``,
GINE) can attend to the same-label ones only, and measurably does better (tests/test_edge_train.py).

Generation happens in a node order where communities are contiguous; a random relabelling at the end hides that
order, because node ids that reveal the community would leak labels and make id-range partitioning unrealistically
good.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import numpy as np

from stages.download.canonical import csr_with_edge_attr, to_csr_incoming
from stages.external_sort import EdgeStream, ExternalCsr, SortSpace, array_chunks, csr_chunks
from storage import spill
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.progress import progress as tqdm

PARETO_ALPHA = 2.2          # tail exponent of the node weights θ (degree ccdf ~ k^-2.2, products-like heavy tail)
COMMUNITIES_PER_CLASS = 4   # classes are unions of communities, so class regions are multi-modal in feature space
MIN_COMMUNITY_NODES = 32    # ... unless that makes communities tiny (see _communities)
P_INTRA = 0.75              # fraction of edge ends kept inside the node's community
P_NEAR = 0.6                # of the other ends: share that lands in a nearby community (related categories)
NEAR_WIDTH = 2              # "nearby" = up to this many steps away on a random ring of communities
CLASS_SKEW = 0.5            # class c gets a share ∝ (c + 1) ** -CLASS_SKEW: mild imbalance, as in real datasets
LABEL_NOISE = 0.10          # labels replaced by a uniformly random class: caps attainable accuracy below 100 %
# Feature signal, in units of the feature noise (std 1 along every direction, so independent of num_features):
# the expected norm of a class centroid is CLASS_SIGNAL_SLOPE * sqrt(ln C) + CLASS_SIGNAL_OFFSET, and of a
# community's offset from it COMMUNITY_SIGNAL. Telling K classes apart at a fixed error needs a margin growing like
# sqrt(ln K); the constants were fitted so that the Bayes-optimal features-only classifier gets ~65 % of the
# noise-free labels for any C from 4 to 100 at F = 100 (55-65 % at F = 16); an MLP trained on a products-like
# 8 % split gets somewhat less, a 2-layer GraphSAGE far more (see tests/test_download_synthetic.py).
CLASS_SIGNAL_SLOPE = 1.75
CLASS_SIGNAL_OFFSET = -0.82
COMMUNITY_SIGNAL = 1.0
FEATURE_BLOCK_ROWS = 1 << 17
EDGE_BLOCK = 1 << 22            # urn entries per block (part of the random stream: changing it changes the graph)
DRAW_SUB_BLOCK = 1 << 18        # entries per step of _draw_ends's arithmetic: int64 temporaries of 2 MB
TOP_UP_TOLERANCE = 0.01         # accept up to 1 % fewer edges than avg_degree * N before generating extra edges
TOP_UP_ROUNDS = 3


def generate_synthetic(num_nodes: int, avg_degree: float, num_features: int, num_classes: int, seed: int,
                       split: tuple[float, float, float] = (0.08, 0.02, 0.90), progress: bool = False,
                       num_edge_features: int = 0, name: str = "synthetic", sort: SortSpace | None = None
                       ) -> Graph:
    """Generate the graph described in the module docstring (undirected, stored symmetrised).

    ``avg_degree`` counts directed edges per node after symmetrisation (``num_edges / num_nodes``); it is
    approximate because self-loops and repeated pairs are dropped. Deterministic for a given ``seed``; topology,
    labels, features and split come from separate random streams, so e.g. changing ``num_features`` keeps the
    same graph and labels. ``num_edge_features`` > 0: edge attributes (module docstring) from a sixth stream.
    ``name``: the dataset the graph is reported as (``synthetic-link`` draws the same graph).

    ``sort`` (a spill directory and budget): the streaming path for graphs larger than memory, the same graph bit
    for bit.
    The random streams are consumed in the same order and block sizes, only where the arrays live changes: the urn
    and the drawn edges go to spill files in ``sort.scratch``, the CSR comes from the external sort within
    ``sort.budget_bytes`` (an ``indices`` memory map), and ``x`` is a memory map; only the O(N) arrays stay in
    memory; ``sort`` adds up the sort's buckets and spill bytes. Edge features
    are not streamed (``num_edge_features`` must be 0).
    """
    check_synthetic(num_nodes, avg_degree, num_features, num_classes, split)
    # spawned children depend on their index only: the sixth (edge attributes) leaves the other five as they were
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)]
    rng_layout, rng_edges, rng_labels, rng_features, rng_split, rng_edge_attr = streams
    steps = tqdm(total=4, desc="synthetic graph", unit="step", disable=not progress, leave=False)

    comm_sizes, comm_class = _communities(rng_layout, num_nodes, num_classes, avg_degree)
    comm = np.repeat(np.arange(comm_sizes.shape[0], dtype=np.int32), comm_sizes)  # community of each node (sorted)
    relabel = rng_layout.permutation(num_nodes).astype(np.int32 if num_nodes < 2**31 else np.int64)

    steps.set_postfix_str("edges")
    expected = _expected_degrees(rng_edges, comm, comm_sizes, avg_degree)
    if sort is None:
        indptr, indices = _topology(rng_edges, expected, comm_sizes, relabel, avg_degree)
    else:
        if num_edge_features:
            raise ValueError("the streaming path does not generate edge features")
        indptr, indices = _streamed_topology(rng_edges, expected, comm_sizes, relabel, avg_degree, sort)
    del expected
    steps.update(2)

    steps.set_postfix_str("labels, features")
    comm_final = np.empty_like(comm)
    comm_final[relabel] = comm
    del comm, relabel
    y = _labels(rng_labels, comm_class[comm_final], num_classes)
    x_out = None if sort is None else np.lib.format.open_memmap(
        os.path.join(sort.scratch, "x.npy"), mode="w+", dtype=np.float32, shape=(num_nodes, num_features))
    x = _features(rng_features, comm_final, comm_class, num_classes, num_features, progress=progress, out=x_out)
    steps.update()
    splits = random_split(rng_split, num_nodes, split)
    steps.update()
    steps.close()
    edge_attr = None
    if num_edge_features:
        indptr, indices, edge_attr = _same_label_edges(rng_edge_attr, indptr, indices, y, num_edge_features)
    return Graph.homogeneous(indptr=indptr, indices=indices, x=x, y=y, splits=splits, num_classes=num_classes,
                             directed=False, name=name, source=f"{name}(seed={seed})", edge_attr=edge_attr)


def _same_label_edges(rng: np.random.Generator, indptr: np.ndarray, indices: np.ndarray, y: np.ndarray,
                      num_edge_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same CSR with float32 edge attributes [E, D] (module docstring): each undirected edge (its u < v copy)
    gets one row, and the canonical path (``csr_with_edge_attr``) gives the reversed copy the same row."""
    n = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    half = indices < dst
    src, dst = indices[half], dst[half]
    attr = np.empty((src.shape[0], num_edge_features), dtype=np.float32)
    attr[:, 0] = y[src] == y[dst]
    attr[:, 1:] = rng.standard_normal((src.shape[0], num_edge_features - 1), dtype=np.float32)
    return csr_with_edge_attr(src, dst, n, attr, directed=False)


def check_synthetic(num_nodes: int, avg_degree: float, num_features: int, num_classes: int,
                    split: tuple[float, float, float]) -> None:
    """The generator's arguments, checked in microseconds: the download Params call this, so a bad value is an
    error before any server or stage starts."""
    if num_nodes < 2:
        raise InputError(f"num_nodes={num_nodes} is too small; a synthetic graph needs num_nodes >= 2")
    if not avg_degree > 0:
        raise InputError(f"avg_degree={avg_degree} must be > 0 (directed edges per node after symmetrisation)")
    if avg_degree > num_nodes - 1:
        raise InputError(f"avg_degree={avg_degree} exceeds num_nodes - 1 = {num_nodes - 1}; lower avg_degree")
    if num_features < 1:
        raise InputError(f"num_features={num_features} must be >= 1")
    if not 2 <= num_classes <= num_nodes:
        raise InputError(f"num_classes={num_classes} must be between 2 and num_nodes={num_nodes}")
    if len(split) != 3 or any(not 0.0 <= float(f) <= 1.0 for f in split) or sum(split) > 1.0 + 1e-9:
        raise InputError(f"split={tuple(split)} must be 3 fractions (train, valid, test) in [0, 1] summing to <= 1")
    if round(split[0] * num_nodes) < 1:
        raise InputError(f"split train fraction {split[0]} gives no training node out of {num_nodes}; raise it")


def _communities(rng: np.random.Generator, num_nodes: int, num_classes: int,
                 avg_degree: float) -> tuple[np.ndarray, np.ndarray]:
    """Community sizes (int64 [K]) and each community's class (int64 [K]).

    Fewer communities per class on small graphs: a community must hold several times a node's intra-community
    degree, or its edges would mostly be repeats of each other (and be dropped).
    """
    min_size = max(MIN_COMMUNITY_NODES, 4.0 * P_INTRA * avg_degree)
    per_class = int(max(1, min(COMMUNITIES_PER_CLASS, num_nodes // (num_classes * min_size))))
    class_share = (np.arange(num_classes) + 1.0) ** -CLASS_SKEW
    class_share = rng.permutation(class_share / class_share.sum())  # which class is big should be arbitrary
    comm_class = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)
    comm_share = class_share[comm_class] / per_class
    sizes = rng.multinomial(num_nodes, comm_share / comm_share.sum())
    return sizes.astype(np.int64), comm_class


def _topology(rng: np.random.Generator, expected: np.ndarray, comm_sizes: np.ndarray, relabel: np.ndarray,
              avg_degree: float) -> tuple[np.ndarray, np.ndarray]:
    """Canonical CSR (final node ids) with about ``avg_degree * N`` directed edges.

    Self-loops and repeated pairs are dropped by the canonicalisation; where that loses more than TOP_UP_TOLERANCE
    of the target (small or dense graphs with small communities, where hubs saturate their community), extra edges
    from the same model make up the shortfall. At products scale the loss is ~0.5 %, so no second pass is paid.
    """
    n = expected.shape[0]
    target = avg_degree * n
    src, dst = _edges(rng, expected, comm_sizes)
    requested = 2 * src.shape[0]
    indptr, indices = to_csr_incoming(relabel[src], relabel[dst], n, directed=False)
    del src, dst
    for _ in range(TOP_UP_ROUNDS):
        have = indices.shape[0]
        if have >= (1.0 - TOP_UP_TOLERANCE) * target or requested == 0 or have == 0:
            break
        keep_rate = have / requested  # new edges collide with existing ones at least as often: loop, not formula
        src, dst = _edges(rng, expected * ((target - have) / (keep_rate * target)), comm_sizes)
        requested = requested + 2 * src.shape[0]
        rows = np.repeat(np.arange(n, dtype=indices.dtype), np.diff(indptr))  # existing edges, already symmetric
        src, dst = relabel[src], relabel[dst]
        indptr, indices = to_csr_incoming(np.concatenate([indices, src, dst]), np.concatenate([rows, dst, src]), n,
                                          directed=True)
        del rows, src, dst
    return indptr, indices


def _streamed_topology(rng: np.random.Generator, expected: np.ndarray, comm_sizes: np.ndarray, relabel: np.ndarray,
                       avg_degree: float, sort: SortSpace) -> tuple[np.ndarray, np.ndarray]:
    """``_topology`` through spill files (``generate_synthetic``'s ``sort``): the same draws, the same top-up
    rule, the same set of edges, hence the same CSR; returns ``(indptr, indices memory map)``."""
    n = expected.shape[0]
    target = avg_degree * n

    def canonical(round_: int, scale: float, previous: ExternalCsr | None) -> tuple[ExternalCsr, int]:
        folder = os.path.join(sort.scratch, f"round-{round_}")
        os.makedirs(folder)
        urn = _urn(rng, expected * scale if scale != 1.0 else expected, os.path.join(folder, "urn.npy"))
        src_path, dst_path = os.path.join(folder, "src.raw"), os.path.join(folder, "dst.raw")
        for path in (src_path, dst_path):
            open(path, "wb").close()
        for lo, hi, block in _edge_blocks(rng, urn, comm_sizes):
            spill.spill_append(src_path, relabel[urn[lo:hi]])
            spill.spill_append(dst_path, relabel[block])
        count = int(urn.shape[0])
        sort.spill_bytes += 2 * count * relabel.dtype.itemsize + urn.nbytes
        del urn
        src, dst = (np.memmap(p, dtype=relabel.dtype, mode="r", shape=(count,)) if count
                    else np.empty(0, relabel.dtype) for p in (src_path, dst_path))
        chunk = sort.chunk_edges
        passes = [array_chunks(src, dst, chunk)]
        if previous is not None:   # the CSR so far is symmetric: symmetrising it again only adds duplicates
            passes.insert(0, csr_chunks(previous.indptr, previous.indices, chunk))
        csr = sort.csr([EdgeStream(lambda: itertools.chain.from_iterable(p() for p in passes), symmetrise=True)],
                       n, scratch=folder)
        return csr, count

    csr, count = canonical(0, 1.0, None)
    requested = 2 * count
    for round_ in range(1, TOP_UP_ROUNDS + 1):
        have = csr.indices.shape[0]
        if have >= (1.0 - TOP_UP_TOLERANCE) * target or requested == 0 or have == 0:
            break
        keep_rate = have / requested
        csr, count = canonical(round_, (target - have) / (keep_rate * target), csr)
        requested = requested + 2 * count
    return csr.indptr, csr.indices


def _edges(rng: np.random.Generator, expected: np.ndarray, comm_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Undirected edge list (each edge once, node ids in the community-sorted order).

    Node u emits ``Poisson(expected_u / 2)`` edges and, because the urn is weight-proportional, receives about as
    many, so its degree after symmetrisation is about ``expected_u``.
    """
    urn = _urn(rng, expected)
    dst = np.empty_like(urn)
    for lo, hi, block in _edge_blocks(rng, urn, comm_sizes):
        dst[lo:hi] = block
    return urn, dst


def _urn(rng: np.random.Generator, expected: np.ndarray, path: str | None = None) -> np.ndarray:
    """Each node repeated ``Poisson(expected_u / 2)`` times (sorted by node, hence grouped by community); with
    ``path`` a memory-mapped ``.npy`` filled one node block at a time (the streaming path)."""
    n = expected.shape[0]
    emitted = rng.poisson(expected / 2.0)
    ids = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    if path is None:
        return np.repeat(ids, emitted)
    ends = np.cumsum(emitted)
    urn = np.lib.format.open_memmap(path, mode="w+", dtype=ids.dtype, shape=(int(ends[-1]) if n else 0,))
    for a in range(0, n, FEATURE_BLOCK_ROWS):
        b = min(n, a + FEATURE_BLOCK_ROWS)
        urn[int(ends[a] - emitted[a]):int(ends[b - 1])] = np.repeat(ids[a:b], emitted[a:b])
    return urn


def _edge_blocks(rng: np.random.Generator, urn: np.ndarray,
                 comm_sizes: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(lo, hi, dst)``: the drawn other ends of the urn's entries ``[lo, hi)``, EDGE_BLOCK at a time (the block
    size is part of the random stream: another one draws another graph)."""
    node_start = np.concatenate([[0], np.cumsum(comm_sizes)])
    seg = np.searchsorted(urn, node_start)  # urn positions where each community's stubs begin
    seg_len = np.diff(seg)
    num_comm = comm_sizes.shape[0]
    ring = rng.permutation(num_comm)          # ring position -> community
    ring_pos = np.empty_like(ring)
    ring_pos[ring] = np.arange(num_comm)      # community -> ring position
    for lo in range(0, urn.shape[0], EDGE_BLOCK):
        hi = min(lo + EDGE_BLOCK, urn.shape[0])
        yield lo, hi, _draw_ends(rng, urn, lo, hi, seg, seg_len, ring, ring_pos)


def _expected_degrees(rng: np.random.Generator, comm: np.ndarray, comm_sizes: np.ndarray,
                      avg_degree: float) -> np.ndarray:
    """Pareto-distributed expected degrees with mean ``avg_degree``, capped so hubs stay realisable.

    Without a cap the heaviest nodes would ask for more distinct neighbours than their community (or the graph)
    has, and dropping the resulting repeated pairs would undershoot ``avg_degree``.
    """
    n = int(comm.shape[0])  # int(): a shape entry is typed Any, which picks rng.pareto's scalar overload for mypy
    theta = 1.0 + rng.pareto(PARETO_ALPHA, n)
    cap_intra = comm_sizes[comm] / (2.0 * P_INTRA)  # intra-community degree at most ~half the community
    cap = np.minimum(cap_intra, np.sqrt(n * avg_degree))  # Chung-Lu structural cutoff: hub pairs stay below 1 edge
    expected = theta * (avg_degree / theta.mean())
    # Capping removes mass; rescale so the mean stays avg_degree (a few fixed-point steps, not a loop over nodes).
    for _ in range(5):
        np.minimum(expected, cap, out=expected)
        expected *= avg_degree / expected.mean()
    return np.minimum(expected, cap, out=expected)


def _draw_ends(rng: np.random.Generator, urn: np.ndarray, lo: int, hi: int, seg: np.ndarray, seg_len: np.ndarray,
               ring: np.ndarray, ring_pos: np.ndarray) -> np.ndarray:
    """The other ends of urn entries ``[lo, hi)``: uniform urn positions in the entry's community with probability
    P_INTRA, else in a nearby community with probability P_NEAR, else anywhere.

    Uniform over urn positions is weight-proportional over nodes, which is what a DC-SBM endpoint needs, at the
    cost of one random gather instead of a binary search. The block's random numbers are drawn whole and in this
    order (they are the stream); the arithmetic then runs DRAW_SUB_BLOCK entries at a time, so a 4 M-entry block
    peaks at ~18 bytes per entry (the float64 ``u``, one float64 draw in flight, flags, int32 ends: ~75 MB) instead
    of the ~300 MB its whole-block int64 temporaries took.
    """
    m, total = hi - lo, urn.shape[0]
    u = rng.random(m)
    kind = rng.random(m)
    intra = kind < P_INTRA
    near = kind < P_INTRA + (1.0 - P_INTRA) * P_NEAR
    near &= ~intra
    del kind
    step = rng.integers(1, NEAR_WIDTH + 1, m).astype(np.int8)   # drawn as int64, as always: same stream
    step[rng.random(m) < 0.5] *= -1
    out = np.empty(m, dtype=urn.dtype)
    for a in range(0, m, DRAW_SUB_BLOCK):
        b = min(m, a + DRAW_SUB_BLOCK)
        comm = np.searchsorted(seg, np.arange(lo + a, lo + b), side="right") - 1   # community of each emitter
        target = np.where(near[a:b], ring[(ring_pos[comm] + step[a:b]) % ring.shape[0]], comm)
        local = intra[a:b] | near[a:b]
        width = np.where(local, seg_len[target], total)
        pos = np.where(local, seg[target], 0) + (u[a:b] * width).astype(np.int64)
        out[a:b] = urn[np.minimum(pos, total - 1)]   # u * width can round up to width for huge widths
    return out


def _labels(rng: np.random.Generator, clean: np.ndarray, num_classes: int) -> np.ndarray:
    """Community class, replaced by a uniformly random class with probability LABEL_NOISE."""
    y = clean.astype(np.int64, copy=True)
    noisy = rng.random(int(y.shape[0])) < LABEL_NOISE  # int(): as in _expected_degrees, so mypy sees an array
    y[noisy] = rng.integers(0, num_classes, int(noisy.sum()))
    return y


def _features(rng: np.random.Generator, comm: np.ndarray, comm_class: np.ndarray, num_classes: int,
              num_features: int, *, progress: bool, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [N, F]: community centroid + N(0, 1) noise, written block by block (no float64 N x F temporary).

    Centroid entries are scaled by 1/sqrt(F) so that the signal-to-noise ratio does not depend on the width.
    """
    scale = 1.0 / np.sqrt(num_features)
    class_signal = max(0.5, CLASS_SIGNAL_SLOPE * np.sqrt(np.log(num_classes)) + CLASS_SIGNAL_OFFSET)
    class_centre = rng.standard_normal((num_classes, num_features)) * (class_signal * scale)
    offset = rng.standard_normal((comm_class.shape[0], num_features)) * (COMMUNITY_SIGNAL * scale)
    centroid = (class_centre[comm_class] + offset).astype(np.float32)
    n = comm.shape[0]
    x = np.empty((n, num_features), dtype=np.float32) if out is None else out
    starts = range(0, n, FEATURE_BLOCK_ROWS)
    for start in tqdm(starts, desc="features", unit="block", disable=not progress or len(starts) < 4, leave=False):
        block = x[start:start + FEATURE_BLOCK_ROWS]
        rng.standard_normal(block.shape, dtype=np.float32, out=block)
        block += centroid[comm[start:start + FEATURE_BLOCK_ROWS]]
    return x


def random_split(rng: np.random.Generator, num_nodes: int, split: tuple[float, float, float]) -> dict[str, np.ndarray]:
    """Disjoint random train/valid/test node sets (sorted int64 ids) of the requested fractions."""
    # Round the cumulative boundaries, not each size, so rounding can never overshoot num_nodes.
    bounds = np.minimum(np.round(np.cumsum([0.0, *split]) * num_nodes).astype(np.int64), num_nodes)
    order = rng.permutation(num_nodes)
    return {name: np.sort(order[bounds[i]:bounds[i + 1]]).astype(np.int64) for i, name in enumerate(SPLITS)}
