"""``partition_report``: how good a partition is (cut and balance), as JSON-able numbers for the stage summary."""

from __future__ import annotations

from typing import Any

import numpy as np

from stages.partition.balance import imbalance
from stages.partition.csr_ops import degrees, row_chunks
from storage.schema import GraphSchema


def edge_cut(indptr: np.ndarray, indices: np.ndarray, part_of_orig: np.ndarray) -> int:
    """Number of CSR entries (directed edges u -> v) whose endpoints lie in different parts.

    For an undirected graph (stored symmetrised) every cut edge counts twice, once per direction: that is the
    number of remote neighbour reads message passing does.
    """
    cut = 0
    deg = degrees(indptr)
    for r0, r1 in row_chunks(indptr):
        dst_part = np.repeat(part_of_orig[r0:r1], deg[r0:r1])  # a repeat: cheaper than gathering by row id
        cut += int(np.count_nonzero(dst_part != part_of_orig[indices[indptr[r0]:indptr[r1]]]))
    return cut


def partition_report(indptr: np.ndarray, indices: np.ndarray, part_of_orig: np.ndarray, train_mask: np.ndarray,
                     num_parts: int) -> dict[str, Any]:
    """``edge_cut``, ``edge_cut_fraction``, per-part ``nodes`` / ``edges`` (incoming CSR entries owned) /
    ``train_nodes``, and ``imbalance`` = max / mean for each of those three."""
    part_of_orig = np.asarray(part_of_orig, dtype=np.int64)
    train_mask = np.asarray(train_mask, dtype=bool)
    nodes = np.bincount(part_of_orig, minlength=num_parts)
    # bincount's float64 weights are exact up to 2^53 edges
    edges = np.rint(np.bincount(part_of_orig, weights=degrees(indptr), minlength=num_parts)).astype(np.int64)
    train_nodes = np.bincount(part_of_orig[train_mask], minlength=num_parts)
    num_edges = int(indices.shape[0])
    cut = edge_cut(indptr, indices, part_of_orig)
    return {
        "edge_cut": cut,
        "edge_cut_fraction": round(cut / num_edges, 6) if num_edges else 0.0,
        "nodes": [int(c) for c in nodes],
        "edges": [int(c) for c in edges],
        "train_nodes": [int(c) for c in train_nodes],
        "imbalance": {"nodes": round(imbalance(nodes), 4), "edges": round(imbalance(edges), 4),
                      "train_nodes": round(imbalance(train_nodes), 4)},
    }


def typed_report(indptr: np.ndarray, indices: np.ndarray, part_of_orig: np.ndarray, node_type: np.ndarray,
                 schema: GraphSchema, num_parts: int) -> dict[str, Any]:
    """Per node type: nodes per part and their imbalance; per edge type: the cut (CSR entries whose endpoints lie
    in different parts) and its fraction. ``indptr`` has the typed graph's (node, edge type) rows."""
    r = schema.num_edge_types
    nodes = {t.name: np.bincount(part_of_orig[node_type == i], minlength=num_parts)
             for i, t in enumerate(schema.node_types)}
    cut, total = np.zeros(r, dtype=np.int64), np.zeros(r, dtype=np.int64)
    deg = degrees(indptr)
    for r0, r1 in row_chunks(indptr):
        row = np.repeat(np.arange(r0, r1, dtype=np.int64), deg[r0:r1])
        crossing = part_of_orig[row // r] != part_of_orig[indices[indptr[r0]:indptr[r1]]]
        cut += np.bincount(row[crossing] % r, minlength=r)
        total += np.bincount(row % r, minlength=r)
    return {
        "node_types": {name: {"nodes": [int(c) for c in counts], "imbalance": round(imbalance(counts), 4)}
                       for name, counts in nodes.items()},
        "edge_types": {e.key: {"edge_cut": int(cut[i]),
                               "edge_cut_fraction": round(int(cut[i]) / int(total[i]), 6) if total[i] else 0.0}
                       for i, e in enumerate(schema.edge_types)},
    }
