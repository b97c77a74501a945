"""``synthetic-hetero``: a MAG-like typed graph whose labels need the typed neighbourhood (no network).

Node types and relations as ogbn-mag has them: ``paper`` (features, labels), ``author``, ``institution``,
``field_of_study`` (no features: models learn their embeddings); ``author writes paper``, ``paper cites paper``,
``paper has_topic field_of_study``, ``author affiliated_with institution``. At ``num_nodes = 1 939 743`` the type
counts and the edges per relation are ogbn-mag's (``MAG_NODES``, ``MAG_EDGES_PER_SOURCE``), scaled by
``avg_degree / MAG_AVG_DEGREE``.

How labels depend on types (so that a relational GNN beats a paper-only MLP and a model that ignores types):

- every paper has a class; authors, fields and institutions have a hidden *home* class;
- a paper's authors and fields are drawn from its class's with probability ``P_HOME_AUTHOR`` / ``P_HOME_FIELD``,
  its citations land in its class with probability ``P_HOME_CITE``, an author's institution with
  ``P_HOME_INSTITUTION``; otherwise anywhere;
- each endpoint is drawn in proportion to a Pareto weight (power-law degrees: prolific authors, popular fields
  and highly cited papers);
- paper features are a class centroid under noise that dominates it (``FEATURE_SIGNAL``), so features alone are
  weak; the fields' home classes are the strongest signal and only reachable through the featureless
  ``field_of_study`` nodes' learnt embeddings;
- a label is replaced by a random class with probability ``LABEL_NOISE``.

Endpoints are drawn with one ``searchsorted`` per edge on a weight cumsum ordered by home class (~0.7 µs per query
on the 2-vCPU benchmark machine: ~15 s for MAG's 21 M edges), all vectorised. Home classes are drawn per node
independently, so an id never reveals a class.

Beyond the memory budget (``sort``: ``stages.download.streamed``) the same graph, bit for bit, is drawn in blocks:
a relation's edges a block of emitters at a time, spilled to raw files in ``sort.scratch`` and handed to
``typed.build_graph`` as memory maps; the paper features into a memory-mapped ``.npy``, block by block (the
in-memory path fills its array in the same blocks). The random streams are consumed as in one piece: NumPy's
generators give the same numbers drawn in pieces, and a relation draws every edge's in-class flag before any
edge's position, so a copy of the edge stream advanced past the flags draws a block's positions beside its flags.
Only the O(N) arrays stay in memory (home classes, weights, the drawer's order and cumsum, emitted counts).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator

import numpy as np

from stages.download.synthetic import CLASS_SKEW, FEATURE_BLOCK_ROWS, LABEL_NOISE, PARETO_ALPHA, random_split
from stages.download.typed import TypedSource, build_graph
from stages.external_sort import SortSpace
from storage import spill
from storage.errors import InputError
from storage.graph import Graph, index_dtype
from storage.schema import EdgeType

MAG_NODES = {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965}
# edges per emitting node in ogbn-mag (a paper draws its authors, citations and fields, an author its
# institution: 7.15 M writes, 5.42 M cites, 7.51 M has_topic, 1.04 M affiliated_with), and its mean in-degree
# once reverses are added (2 * 21.1 M / 1.94 M)
WRITES, CITES, HAS_TOPIC, AFFILIATED = (EdgeType("author", "writes", "paper"), EdgeType("paper", "cites", "paper"),
                                        EdgeType("paper", "has_topic", "field_of_study"),
                                        EdgeType("author", "affiliated_with", "institution"))
MAG_EDGES_PER_SOURCE = {WRITES: 9.71, CITES: 7.36, HAS_TOPIC: 10.20, AFFILIATED: 0.92}
MAG_AVG_DEGREE = 21.8
P_HOME_AUTHOR = 0.8
P_HOME_FIELD = 0.7
P_HOME_CITE = 0.5
P_HOME_INSTITUTION = 0.5
FEATURE_SIGNAL = 1.0   # norm of a class centroid, in units of the per-direction feature noise (std 1)
# how each relation is drawn, in the order the edge stream draws them: (the emitter is the target type, P_HOME_*)
RELATIONS = {WRITES: (True, P_HOME_AUTHOR), CITES: (False, P_HOME_CITE), HAS_TOPIC: (False, P_HOME_FIELD),
             AFFILIATED: (False, P_HOME_INSTITUTION)}
# per edge of a drawn block: its emitter, class and flag (int64 ids and classes 16, the float64 flag and position
# draws 16), pick's float64 bounds and their arithmetic (~40) and the int64 position and end (16): 88, rounded up
DRAW_BYTES_PER_EDGE = 96
MIN_DRAW_EDGES = 1 << 12   # a draw block's floor: a budget near the minimum still draws in blocks of this many
# per paper row of a feature block: its centroids in float64 and their float32 cast (12 B a column), rounded up
FEATURE_BYTES_PER_VALUE = 16


def generate_synthetic_hetero(num_nodes: int, avg_degree: float, num_features: int, num_classes: int, seed: int,
                              split: tuple[float, float, float] = (0.08, 0.02, 0.90), *,
                              add_reverse: bool = True, sort: SortSpace | None = None) -> Graph:
    """The graph of the module docstring; deterministic for ``seed`` (topology, labels, features and split from
    separate streams). ``sort``: the same graph drawn in blocks through spill files (module docstring)."""
    counts = type_counts(num_nodes, num_classes)
    rng_classes, rng_edges, rng_features, rng_split = (np.random.default_rng(s)
                                                       for s in np.random.SeedSequence(seed).spawn(4))
    home = {t: _home_classes(rng_classes, n, num_classes) for t, n in counts.items()}
    weight = {t: rng_classes.pareto(PARETO_ALPHA, n) + 1.0 for t, n in counts.items()}
    scale = avg_degree / MAG_AVG_DEGREE
    draw = _Drawer(rng_edges, home, weight, num_classes)
    del weight
    edges = {e: _edges(draw, e, MAG_EDGES_PER_SOURCE[e] * scale, sort) for e in RELATIONS}
    del draw
    y = home["paper"].astype(np.int64)
    noisy = rng_classes.random(int(y.shape[0])) < LABEL_NOISE   # int(): mypy sees an array
    y[noisy] = rng_classes.integers(0, num_classes, int(noisy.sum()))
    x = _features(rng_features, home.pop("paper"), num_classes, num_features, sort)
    del home
    src = TypedSource(num_nodes=counts, edges=edges, features={"paper": x}, labels={"paper": (y, num_classes)},
                      splits={"paper": random_split(rng_split, counts["paper"], split)}, name="synthetic-hetero",
                      source=f"synthetic-hetero(seed={seed})")
    return build_graph(src, add_reverse=add_reverse, sort=sort)


def expected_edges(num_nodes: int, avg_degree: float, num_classes: int) -> dict[EdgeType, int]:
    """The mean number of edges each relation draws (Poisson counts per emitter): for the memory estimates."""
    counts = type_counts(num_nodes, num_classes)
    scale = avg_degree / MAG_AVG_DEGREE
    return {e: int(MAG_EDGES_PER_SOURCE[e] * scale * counts[e.dst if from_target else e.src])
            for e, (from_target, _) in RELATIONS.items()}


def _edges(draw: _Drawer, e: EdgeType, per_source: float, sort: SortSpace | None) -> tuple[np.ndarray, np.ndarray]:
    """Edge type e's (source ids, target ids): whole arrays, or with ``sort`` memory maps of the spill files its
    blocks were appended to (ids in the index dtype of their node type: the same values, half the disk)."""
    from_target, p_home = RELATIONS[e]
    if sort is None:   # one block (the generator runs to its end: it hands the edge stream on to the next relation)
        (whole,) = list(draw.relation(e.src, e.dst, per_source, p_home, from_target=from_target))
        return whole
    paths = [os.path.join(sort.scratch, f"edges-{e.key}.{end}") for end in ("src", "dst")]
    dtypes = [index_dtype(draw.home[t].shape[0]) for t in (e.src, e.dst)]
    for path in paths:
        open(path, "wb").close()
    count = 0
    block = max(MIN_DRAW_EDGES, sort.budget_bytes // DRAW_BYTES_PER_EDGE)
    for ends in draw.relation(e.src, e.dst, per_source, p_home, from_target=from_target, block_edges=block):
        for path, ids, dtype in zip(paths, ends, dtypes):
            spill.spill_append(path, ids.astype(dtype, copy=False))
        count += ends[0].shape[0]
    sort.spill_bytes += count * sum(d.itemsize for d in dtypes)
    src, dst = (np.memmap(p, dtype=d, mode="r", shape=(count,)) if count else np.empty(0, d)
                for p, d in zip(paths, dtypes))
    return src, dst


def _features(rng: np.random.Generator, home: np.ndarray, num_classes: int, num_features: int,
              sort: SortSpace | None) -> np.ndarray:
    """float32 [papers, F]: the class centroid under N(0, 1) noise, filled block by block (with ``sort`` into a
    memory-mapped ``.npy`` in its scratch, blocks sized to its budget)."""
    centre = rng.standard_normal((num_classes, num_features)) * (FEATURE_SIGNAL / np.sqrt(num_features))
    shape = (home.shape[0], num_features)
    if sort is None:
        x, rows = np.empty(shape, dtype=np.float32), FEATURE_BLOCK_ROWS
    else:
        x = np.lib.format.open_memmap(os.path.join(sort.scratch, "x-paper.npy"), mode="w+", dtype=np.float32,
                                      shape=shape)
        rows = max(1, min(FEATURE_BLOCK_ROWS, sort.budget_bytes // (FEATURE_BYTES_PER_VALUE * num_features)))
    for lo in range(0, shape[0], rows):
        block = x[lo:lo + rows]
        rng.standard_normal(block.shape, dtype=np.float32, out=block)
        block += centre[home[lo:lo + rows]].astype(np.float32)
    return x


def type_counts(num_nodes: int, num_classes: int) -> dict[str, int]:
    """ogbn-mag's shares of ``num_nodes``, summing to exactly ``num_nodes``; at least ``num_classes`` papers and one
    node of every other type.

    Largest remainder: each type gets its share rounded down, the nodes left over go one each to the largest
    remainders (rounding each share on its own gave 5,001 nodes for 5,000). Integer arithmetic, so no float ties. A
    type below its minimum is topped up from the largest type (authors)."""
    total = sum(MAG_NODES.values())
    shares = {t: divmod(num_nodes * n, total) for t, n in MAG_NODES.items()}
    counts = {t: q for t, (q, _) in shares.items()}
    left = num_nodes - sum(counts.values())
    for t in sorted(shares, key=lambda t: shares[t][1], reverse=True)[:left]:   # stable: ties in MAG_NODES order
        counts[t] += 1
    for t in counts:
        short = (num_classes if t == "paper" else 1) - counts[t]
        if short > 0:
            counts[max(counts, key=lambda u: counts[u])] -= short
            counts[t] += short
    return counts


def check_synthetic_hetero(num_nodes: int, num_classes: int) -> None:
    """Arguments checked in microseconds (the download Params call it before any stage starts)."""
    if num_nodes < 100:
        raise InputError(f"num_nodes={num_nodes} is too small for synthetic-hetero; use num_nodes >= 100")
    if not 2 <= num_classes <= type_counts(num_nodes, num_classes)["paper"] // 2:
        raise InputError(f"num_classes={num_classes} must be between 2 and half the papers "
                         f"({type_counts(num_nodes, 2)['paper'] // 2} at num_nodes={num_nodes})")


def _home_classes(rng: np.random.Generator, n: int, num_classes: int) -> np.ndarray:
    """Mildly skewed class shares, as the homogeneous generator's (share of class c ∝ (c + 1) ** -CLASS_SKEW)."""
    share = (np.arange(num_classes) + 1.0) ** -CLASS_SKEW
    return rng.choice(num_classes, size=n, p=share / share.sum()).astype(np.int64)


class _Drawer:
    """Weight-proportional endpoints, in a class (``home``) or anywhere: one searchsorted on the weight cumsum of
    the type's nodes ordered by home class."""

    def __init__(self, rng: np.random.Generator, home: dict[str, np.ndarray], weight: dict[str, np.ndarray],
                 num_classes: int) -> None:
        self.rng, self.home = rng, home
        self.order = {t: np.argsort(h, kind="stable") for t, h in home.items()}
        self.cum = {t: np.cumsum(weight[t][self.order[t]]) for t in home}
        self.class_lo = {}
        for t, h in home.items():
            per_class = np.bincount(h, minlength=num_classes)   # a class no node of the type has: empty
            ends = np.cumsum(per_class)
            before = np.concatenate([[0.0], self.cum[t]])
            self.class_lo[t] = (before[ends - per_class], before[ends])

    def pick(self, node_type: str, cls: np.ndarray, in_class: np.ndarray,
             u: np.ndarray | None = None) -> np.ndarray:
        """One node of ``node_type`` per query: of class ``cls`` where ``in_class`` (and the class has nodes),
        else of any class; weight-proportional, at uniform position ``u`` in [0, 1) of the chosen range (drawn
        here when not given)."""
        if u is None:
            u = self.rng.random(int(cls.shape[0]))   # int(): as in relation
        cum = self.cum[node_type]
        lo_c, hi_c = self.class_lo[node_type]
        home = in_class & (hi_c[cls] > lo_c[cls])
        lo = np.where(home, lo_c[cls], 0.0)
        hi = np.where(home, hi_c[cls], cum[-1])
        pos = np.searchsorted(cum, lo + u * (hi - lo), side="right")
        return self.order[node_type][np.minimum(pos, cum.shape[0] - 1)]

    def relation(self, src: str, dst: str, per_source: float, p_home: float, *, from_target: bool = False,
                 block_edges: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Edges src -> dst: ``per_source`` per node of the *emitting* type on average (the target type when
        ``from_target``: a paper draws its authors), the other end drawn in the emitter's class with ``p_home``;
        (src ids, dst ids) in blocks of whole emitters of about ``block_edges`` edges (None: one block)."""
        emitter, other = (dst, src) if from_target else (src, dst)
        n = int(self.home[emitter].shape[0])   # int(): a shape entry is Any, which picks poisson's scalar overload
        emitted = self.rng.poisson(per_source, n)
        ends = np.cumsum(emitted)
        # the stream draws all flags, then all positions (one 64-bit draw each): this copy of the stream, advanced
        # past the flags, draws the positions
        bits = copy.deepcopy(self.rng.bit_generator)
        assert isinstance(bits, np.random.PCG64)   # default_rng's generator, which can skip ahead
        positions = np.random.Generator(bits.advance(int(ends[-1]) if n else 0))
        a = 0
        while a < n:
            b = n if block_edges is None else _block_end(ends, a, block_edges)
            ids = np.repeat(np.arange(a, b, dtype=np.int64), emitted[a:b])
            in_class = self.rng.random(ids.shape[0]) < p_home
            picked = self.pick(other, self.home[emitter][ids], in_class, positions.random(ids.shape[0]))
            yield (picked, ids) if from_target else (ids, picked)
            a = b
        self.rng.bit_generator.state = positions.bit_generator.state


def _block_end(ends: np.ndarray, a: int, block_edges: int) -> int:
    """The end of the block of emitters from ``a`` that holds at most ``block_edges`` edges (``ends``: cumulative
    edges per emitter), and at least one emitter."""
    before = int(ends[a - 1]) if a else 0
    return min(ends.shape[0], max(a + 1, int(np.searchsorted(ends, before + block_edges, side="right"))))
