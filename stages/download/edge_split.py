"""Edge splits for link prediction ([6/7], docs/design.md §4): held-out positive edges and the message-passing graph.

The positives of one target edge type are split into train / valid / test by fractions and a seed (PyG
``RandomLinkSplit``'s meaning). The valid and test edges leave the graph the samplers see, so that no training
sample reaches them:

- a symmetrised type (source type = target type, stored in both directions: ``storage.graph``) is split as
  undirected pairs ``u < v``; a held-out pair leaves in both directions;
- a directed type's held-out edge ``u -> v`` also takes ``v -> u`` out of its reverse type (``rev_<rel>``, which
  ``add_reverse`` made; or the forward type, when the target is a ``rev_`` type), when the graph has one.

Train positives stay in the graph (the model learns to score edges it also passes messages along, as in PyG's
default ``disjoint_train_ratio=0``). Everything here is in orig ids and vectorised: one ``isin`` over the target
and reverse types' entries. Beyond the memory budget ``edge_split_stream`` makes the same split, byte for byte,
from a memory-mapped CSR read in row chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from stages.runtime.sampling.fanouts import match_edge_type
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.schema import EdgeType


def edge_entries(graph: Graph, edge_type: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(entry, src, dst)``: the positions in ``graph.indices`` of type ``edge_type``'s edges, and their ends."""
    r = graph.schema.num_edge_types
    rows = np.arange(edge_type, graph.indptr.shape[0] - 1, r)
    count = graph.indptr[rows + 1] - graph.indptr[rows]
    dst = np.repeat(rows // r, count)
    first = np.repeat(graph.indptr[rows], count)
    entry = first + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count))
    return entry, graph.indices[entry], dst


def reverse_type(graph: Graph, edge_type: int) -> int | None:
    """The id of ``edge_type``'s reverse, if the graph has it: ``(dst, rev_<rel>, src)`` (``EdgeType.reverse``),
    or, for a ``rev_`` type itself, the forward type it reverses."""
    et = graph.schema.edge_types[edge_type]
    candidates = [et.reverse()]
    if et.rel.startswith("rev_"):
        candidates.append(EdgeType(et.dst, et.rel.removeprefix("rev_"), et.src))
    return next((graph.schema.edge_types.index(c) for c in candidates if c in graph.schema.edge_types), None)


def check_link_split(fractions: tuple[float, float, float]) -> None:
    """Three non-negative fractions summing to 1, with some training edges (InputError otherwise)."""
    if abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0 or fractions[0] <= 0:
        raise InputError(f"link_split={','.join(map(str, fractions))}: give train, valid, test fractions, "
                         f"non-negative, summing to 1, with train > 0 (e.g. 0.85,0.05,0.10)")


def link_edge_type_index(edge_types: Sequence[EdgeType], link_edge_type: str | None) -> int:
    """The position in ``edge_types`` (a schema's, in its order) of the edge type ``link_edge_type`` names
    (``src___rel___dst`` or a unique relation name; None: the only one), InputError otherwise."""
    names = [e.as_tuple() for e in edge_types]
    if link_edge_type is None and len(names) > 1:
        raise InputError(f"task=link on a typed graph: set link_edge_type to the edge type to predict (one of "
                         f"{', '.join(e.key for e in edge_types)})")
    try:
        return 0 if link_edge_type is None else match_edge_type(link_edge_type, names, "link_edge_type")
    except ValueError as err:
        raise InputError(str(err)) from None


def split_sizes(num_pairs: int, fractions: tuple[float, float, float]) -> tuple[int, int]:
    """``(n_valid, n_test)`` of ``num_pairs`` positives: the first ``n_valid`` of the seed's permutation are
    valid, the next ``n_test`` test, the rest train (at most ``num_pairs`` held out: each rounds by at most 1/2
    and the train fraction is positive)."""
    return int(round(fractions[1] * num_pairs)), int(round(fractions[2] * num_pairs))


def split_edges(graph: Graph, edge_type: int, fractions: tuple[float, float, float], seed: int
                ) -> tuple[Graph, dict[str, np.ndarray]]:
    """``(message-passing graph, {split: int64 [2, E_split] (src, dst) orig ids})`` (module docstring); the graph
    carries the splits too (``Graph.edge_splits``, written by ``storage.graph.write_graph``)."""
    check_link_split(fractions)
    et: EdgeType = graph.schema.edge_types[edge_type]
    entry, src, dst = edge_entries(graph, edge_type)
    symmetric = et.src == et.dst and not graph.directed
    keep = src < dst if symmetric else np.ones(src.shape[0], dtype=bool)   # one entry per undirected pair
    pairs = np.stack([src[keep], dst[keep]])
    order = np.random.default_rng(seed).permutation(pairs.shape[1])
    n_valid, n_test = split_sizes(pairs.shape[1], fractions)
    cut = {"valid": order[:n_valid], "test": order[n_valid:n_valid + n_test], "train": order[n_valid + n_test:]}
    splits = {s: pairs[:, np.sort(cut[s])] for s in SPLITS}
    n = graph.num_nodes
    held = np.concatenate([splits["valid"], splits["test"]], axis=1)
    held_key = np.sort(held[0] * n + held[1])
    drop = np.isin(src * n + dst, held_key, assume_unique=False)
    if symmetric:
        drop |= np.isin(dst * n + src, held_key)
    dropped = [entry[drop]]
    rev = reverse_type(graph, edge_type)
    if rev is not None and rev != edge_type:
        rev_entry, rev_src, rev_dst = edge_entries(graph, rev)
        dropped.append(rev_entry[np.isin(rev_dst * n + rev_src, held_key)])
    mp = replace(_without(graph, np.concatenate(dropped)), edge_splits=splits, link_edge_type=et.key)
    return mp, splits


def _without(graph: Graph, entries: np.ndarray) -> Graph:
    """``graph`` with the CSR entries ``entries`` removed (rows keep their order), their edge features with them."""
    keep = np.ones(graph.indices.shape[0], dtype=bool)
    keep[entries] = False
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    return replace(graph, indptr=kept_before[graph.indptr].astype(np.int64), indices=graph.indices[keep],
                   edge_attr=None if graph.edge_attr is None else graph.edge_attr[keep])
