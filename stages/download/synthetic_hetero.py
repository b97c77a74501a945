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
"""

from __future__ import annotations

import numpy as np

from stages.download.synthetic import CLASS_SKEW, LABEL_NOISE, PARETO_ALPHA, random_split
from stages.download.typed import TypedSource, build_graph
from storage.errors import InputError
from storage.graph import Graph
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


def generate_synthetic_hetero(num_nodes: int, avg_degree: float, num_features: int, num_classes: int, seed: int,
                              split: tuple[float, float, float] = (0.08, 0.02, 0.90), *,
                              add_reverse: bool = True) -> Graph:
    """The graph of the module docstring; deterministic for ``seed`` (topology, labels, features and split from
    separate streams)."""
    counts = type_counts(num_nodes, num_classes)
    rng_classes, rng_edges, rng_features, rng_split = (np.random.default_rng(s)
                                                       for s in np.random.SeedSequence(seed).spawn(4))
    home = {t: _home_classes(rng_classes, n, num_classes) for t, n in counts.items()}
    weight = {t: rng_classes.pareto(PARETO_ALPHA, n) + 1.0 for t, n in counts.items()}
    scale = avg_degree / MAG_AVG_DEGREE
    draw = _Drawer(rng_edges, home, weight, num_classes)
    edges = {
        WRITES: draw.relation("author", "paper", MAG_EDGES_PER_SOURCE[WRITES] * scale, P_HOME_AUTHOR,
                              from_target=True),
        CITES: draw.relation("paper", "paper", MAG_EDGES_PER_SOURCE[CITES] * scale, P_HOME_CITE),
        HAS_TOPIC: draw.relation("paper", "field_of_study", MAG_EDGES_PER_SOURCE[HAS_TOPIC] * scale, P_HOME_FIELD),
        AFFILIATED: draw.relation("author", "institution", MAG_EDGES_PER_SOURCE[AFFILIATED] * scale,
                                  P_HOME_INSTITUTION),
    }
    y = home["paper"].astype(np.int64)
    noisy = rng_classes.random(int(y.shape[0])) < LABEL_NOISE   # int(): mypy sees an array
    y[noisy] = rng_classes.integers(0, num_classes, int(noisy.sum()))
    centre = rng_features.standard_normal((num_classes, num_features)) * (FEATURE_SIGNAL / np.sqrt(num_features))
    x = rng_features.standard_normal((counts["paper"], num_features), dtype=np.float32)
    x += centre[home["paper"]].astype(np.float32)
    src = TypedSource(num_nodes=counts, edges=edges, features={"paper": x}, labels={"paper": (y, num_classes)},
                      splits={"paper": random_split(rng_split, counts["paper"], split)}, name="synthetic-hetero",
                      source=f"synthetic-hetero(seed={seed})")
    return build_graph(src, add_reverse=add_reverse)


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

    def pick(self, node_type: str, cls: np.ndarray, in_class: np.ndarray) -> np.ndarray:
        """One node of ``node_type`` per query: of class ``cls`` where ``in_class`` (and the class has nodes),
        else of any class; weight-proportional."""
        cum = self.cum[node_type]
        lo_c, hi_c = self.class_lo[node_type]
        home = in_class & (hi_c[cls] > lo_c[cls])
        lo = np.where(home, lo_c[cls], 0.0)
        hi = np.where(home, hi_c[cls], cum[-1])
        pos = np.searchsorted(cum, lo + self.rng.random(cls.shape[0]) * (hi - lo), side="right")
        return self.order[node_type][np.minimum(pos, cum.shape[0] - 1)]

    def relation(self, src: str, dst: str, per_source: float, p_home: float, *, from_target: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Edges src -> dst: ``per_source`` per node of the *emitting* type on average (the target type when
        ``from_target``: a paper draws its authors), the other end drawn in the emitter's class with ``p_home``."""
        emitter, other = (dst, src) if from_target else (src, dst)
        n = self.home[emitter].shape[0]
        emitted = self.rng.poisson(per_source, n)
        ids = np.repeat(np.arange(n, dtype=np.int64), emitted)
        ends = self.pick(other, self.home[emitter][ids], self.rng.random(ids.shape[0]) < p_home)
        return (ends, ids) if from_target else (ids, ends)
