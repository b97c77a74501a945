"""Fanout validation, kept free of torch/PyG imports so configs validate in milliseconds (``gnnpipe status``).

A bad fanout is a ``ValueError`` here, as every broken invariant of the runtime library (storage/errors.py): the
stages' Params validate their fanouts with this function, and pydantic turns the ValueError into the user's one-line
error naming the parameter (``stages.params.Fanouts``); the samplers re-check the fanouts they are given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from storage.schema import KEY_SEPARATOR, GraphSchema

Fanout = int | tuple[int, ...]
"""One hop's fanout: a count for every edge type (-1 = all), or one count per edge type by edge type id (0 = none of
that type), which ``hop_fanouts`` makes of ``edge_fanouts``."""


def check_fanout(fanout: int) -> None:
    if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or fanout == 0 or fanout < -1:
        raise ValueError(f"invalid fanout {fanout!r}: each hop needs a positive number of neighbours, "
                         f"or -1 for all of them")


def validate_fanouts(fanouts: Iterable[int]) -> list[int]:
    """One fanout per hop: a positive count, or -1 for all neighbours."""
    fanouts = list(fanouts)
    if not fanouts:
        raise ValueError("fanouts is empty: give one value per hop, e.g. [15, 10, 5] (-1 = all neighbours)")
    for fanout in fanouts:
        check_fanout(fanout)
    return [int(f) for f in fanouts]


def validate_hop_fanouts(fanouts: Iterable[Fanout]) -> list[Fanout]:
    """``validate_fanouts`` where a hop may also be one count per edge type (0 allowed there: that type is not
    sampled)."""
    out: list[Fanout] = []
    for fanout in fanouts:
        if isinstance(fanout, (tuple, list)):
            for f in fanout:
                if f != 0:
                    check_fanout(f)
            out.append(tuple(int(f) for f in fanout))
        else:
            out.append(validate_fanouts([fanout])[0])
    if not out:
        validate_fanouts([])
    return out


def check_edge_fanouts(edge_fanouts: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """``edge_fanouts`` values: per hop, a positive count, -1 (all) or 0 (none of that edge type)."""
    out = {}
    for key, fanouts in edge_fanouts.items():
        fanouts = list(fanouts)
        if not fanouts:
            raise ValueError(f"edge_fanouts[{key!r}] is empty: give one value per hop")
        for f in fanouts:
            if f != 0:
                check_fanout(f)
        out[str(key)] = tuple(int(f) for f in fanouts)
    return out


def hop_fanouts(fanouts: Sequence[int], edge_fanouts: Mapping[str, Sequence[int]],
                edge_types: Sequence[tuple[str, str, str]]) -> list[Fanout]:
    """The samplers' fanout of each hop: ``fanouts`` for every edge type, except the edge types ``edge_fanouts``
    names (by ``src___rel___dst`` key, or by relation name where that is unique), which take their own per hop.
    ValueError (one line) for a name the graph does not have or a length other than ``len(fanouts)``."""
    if not edge_fanouts:
        return list(fanouts)
    chosen: dict[int, Sequence[int]] = {}
    for name, per_hop in edge_fanouts.items():
        if len(per_hop) != len(fanouts):
            raise ValueError(f"edge_fanouts[{name!r}] has {len(per_hop)} values, fanouts {len(fanouts)}: give one per "
                             f"hop")
        chosen[match_edge_type(name, edge_types, "edge_fanouts")] = per_hop
    return [tuple(int(chosen[e][h]) if e in chosen else int(fanouts[h]) for e in range(len(edge_types)))
            for h in range(len(fanouts))]


def match_edge_type(name: str, edge_types: Sequence[tuple[str, str, str]], what: str) -> int:
    """The position of the edge type ``name`` names (its ``src___rel___dst`` key, or its relation where that is
    unique); ValueError (one line, ``what`` names the setting) otherwise."""
    keys = [KEY_SEPARATOR.join(e) for e in edge_types]
    matches = [i for i, k in enumerate(keys) if k == name] or [i for i, e in enumerate(edge_types) if e[1] == name]
    if len(matches) != 1:
        found = "no" if not matches else "more than one"
        raise ValueError(f"{what} names {name!r}: {found} edge type of this graph has that key or relation (its edge "
                         f"types: {', '.join(keys)})")
    return matches[0]


def graph_fanouts(fanouts: Sequence[int], edge_fanouts: Mapping[str, Sequence[int]],
                  schema: GraphSchema) -> list[Fanout]:
    """``hop_fanouts`` for ``schema``'s edge types: a ValueError when a name or length does not fit, which the
    stages check first (``stages.params.check_graph_fanouts``) and report as the user's error."""
    return hop_fanouts(fanouts, edge_fanouts, [e.as_tuple() for e in schema.edge_types])


def sampled_nodes_bound(seeds: int, seed_types: Iterable[int], fanouts: Sequence[Fanout],
                        edge_types: Sequence[tuple[int, int]], type_nodes: Sequence[int]) -> int:
    """An upper bound on the distinct nodes a batch of ``seeds`` seeds samples, the seeds included. Each hop a
    frontier node of type d draws the hop's fanout of every edge type (s, d) into it (-1: all, so at most every
    node of type s), and the next frontier is the new nodes alone (``MultiHopSampler.sample``), so each type's new
    nodes are capped by its unseen ones. Seeds that may be of any of ``seed_types`` (type ids) count once for each
    (a batch may mix them). ``edge_types``: (src, dst) type ids in edge type id order; ``fanouts``: per hop, a
    count for every edge type or one per edge type (``hop_fanouts``); ``type_nodes``: each type's node count.

    On one type this is the seeds times (1 + fanout) per hop, capped at the graph. On a typed graph a hop's fanout
    applies to each edge type into a node: with 3 such types a hop brings up to 3 times the fanout."""
    total = 0
    for seed_type in set(seed_types):
        seen = [0] * len(type_nodes)
        seen[seed_type] = min(seeds, type_nodes[seed_type])
        frontier = list(seen)
        for fanout in fanouts:
            per_edge = fanout if isinstance(fanout, tuple) else (fanout,) * len(edge_types)
            drawn = [0] * len(type_nodes)
            for (src, dst), count in zip(edge_types, per_edge, strict=True):
                if count and frontier[dst]:
                    drawn[src] += type_nodes[src] if count < 0 else count * frontier[dst]
            frontier = [min(d, n - s) for d, n, s in zip(drawn, type_nodes, seen, strict=True)]
            seen = [s + f for s, f in zip(seen, frontier, strict=True)]
        total += sum(seen)
    return min(total, sum(type_nodes))
