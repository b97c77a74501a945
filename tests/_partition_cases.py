"""Graphs of the partition stage's tests that several test files share: a community graph METIS splits by its
communities, and a small downloaded graph for the stage's memory budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from storage import ArtifactStore, Manifest
from tests._train_pipeline import build_without_prefect


def csr_from_edges(src_orig: np.ndarray, dst_orig: np.ndarray, num_nodes: int, *,
                   directed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Incoming-edge CSR (storage.graph conventions: sorted rows, no self-loops or duplicates)."""
    src_orig, dst_orig = np.asarray(src_orig, dtype=np.int64), np.asarray(dst_orig, dtype=np.int64)
    if not directed:
        src_orig, dst_orig = np.concatenate([src_orig, dst_orig]), np.concatenate([dst_orig, src_orig])
    keep = src_orig != dst_orig
    key = np.unique(dst_orig[keep] * num_nodes + src_orig[keep])
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(key // num_nodes, minlength=num_nodes), out=indptr[1:])
    return indptr, key % num_nodes


def community_graph(num_nodes: int = 4000, num_comms: int = 4, avg_degree: int = 12, p_in: float = 0.95,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stochastic block model with train nodes concentrated in community 0 (90 % of it vs 1 % elsewhere): METIS
    finds the communities, and that puts nearly all train nodes in one part. Returns (indptr, indices, train, comm).
    """
    rng = np.random.default_rng(seed)
    comm_of_orig = rng.integers(0, num_comms, num_nodes)
    members = [np.flatnonzero(comm_of_orig == c) for c in range(num_comms)]
    num_pairs = num_nodes * avg_degree // 2
    src_orig = rng.integers(0, num_nodes, num_pairs)
    same = rng.random(num_pairs) < p_in
    dst_orig = rng.integers(0, num_nodes, num_pairs)
    for c in range(num_comms):
        rows = same & (comm_of_orig[src_orig] == c)
        dst_orig[rows] = rng.choice(members[c], int(rows.sum()))
    indptr, indices = csr_from_edges(src_orig, dst_orig, num_nodes)
    train = np.where(comm_of_orig == 0, rng.random(num_nodes) < 0.9, rng.random(num_nodes) < 0.01)
    return indptr, indices, train, comm_of_orig


PARTITION_GRAPH = {"num_nodes": 3000, "avg_degree": 10, "num_features": 4, "num_classes": 3, "seed": 5}


def download_graph(root: Path, **extra: Any) -> tuple[ArtifactStore, Manifest]:
    """``PARTITION_GRAPH`` (with ``extra`` download parameters) built by the download stage under ``root``."""
    store, m = build_without_prefect({"artifacts": str(root), **PARTITION_GRAPH, **extra, "until": "download"})
    return store, m["download"]
