"""Typed graphs under the download stage's memory budget: the external sort builds the typed CSR (one row per node
and edge type) the in-memory path builds, and synthetic-hetero draws the same edges in blocks as whole."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from stages.download.canonical import Relation, check_num_nodes, typed_csr_incoming
from stages.download.external_sort import EdgeStream, array_chunks, count_rows, external_typed_csr
from stages.download.synthetic_hetero import _Drawer
from storage import InputError


def test_the_typed_external_sort_matches_the_in_memory_typed_csr(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base, n = {"a": 0, "b": 300, "c": 700}, 760
    size = {"a": 300, "b": 400, "c": 60}
    # (src type, dst type, symmetrise, id dtype): a symmetrised same-type relation, a directed one, two across types
    types = [("a", "a", True, np.int32), ("b", "b", False, np.int64), ("a", "b", False, np.uint64),
             ("b", "c", False, np.int16)]
    relations, streams = [], []
    for src_type, dst_type, symmetrise, dtype in types:
        src = rng.integers(0, size[src_type], 3000).astype(dtype)
        dst = rng.integers(0, size[dst_type], 3000).astype(dtype)
        if src_type == dst_type:
            src[:30] = dst[:30]   # self-loops
        src[30:60], dst[30:60] = src[60:90], dst[60:90]   # duplicates
        relations.append(Relation(src.astype(np.int64) + base[src_type], dst.astype(np.int64) + base[dst_type],
                                  symmetrise=symmetrise))
        streams.append(EdgeStream(array_chunks(src, dst, 777), symmetrise=symmetrise, src_base=base[src_type],
                                  dst_base=base[dst_type]))
    indptr, indices = typed_csr_incoming(relations, n)
    # the count pass bounds each row's keys (duplicates still in), which sizes the buckets to the budget
    counts = count_rows(streams, n)
    keys = sum(int(np.count_nonzero(r.src != r.dst)) * (2 if r.symmetrise else 1) for r in relations)
    assert (counts >= np.diff(indptr)).all() and counts.sum() == keys
    csr = external_typed_csr(streams, n, budget_bytes=40_000, scratch=str(tmp_path))
    assert csr.buckets > 1 and csr.indptr.shape == (n * len(types) + 1,)   # the budget really splits it
    assert np.array_equal(csr.indptr, indptr) and np.array_equal(np.asarray(csr.indices), indices)
    assert sorted(os.listdir(tmp_path)) == ["indices.raw"]


def test_typed_keys_refuse_a_node_count_that_would_overflow_int64() -> None:
    # keys (v * R + e) * N + u < N * N * R must stay below 2**63: N <= 3.04e9 / sqrt(R)
    check_num_nodes(1_147_000_000, 7)
    with pytest.raises(InputError, match=r"num_nodes=1148000000 is out of range.* <= 1147\d+ with 7 edge types"):
        check_num_nodes(1_148_000_000, 7)
    with pytest.raises(InputError, match="out of range"):   # before the O(N * R) row counts are allocated
        external_typed_csr([EdgeStream(array_chunks(np.zeros(0), np.zeros(0), 1))] * 7, 2_000_000_000,
                           budget_bytes=1, scratch="/nonexistent")


def test_a_relation_drawn_in_blocks_is_the_relation_drawn_whole() -> None:
    rng = np.random.default_rng(4)
    home = {"paper": rng.integers(0, 3, 500), "author": rng.integers(0, 3, 800)}
    weight = {t: rng.pareto(2.2, h.shape[0]) + 1.0 for t, h in home.items()}
    whole, blocked = (_Drawer(np.random.default_rng(9), home, weight, 3) for _ in range(2))
    (want,) = whole.relation("author", "paper", 6.0, 0.8, from_target=True)
    blocks = list(blocked.relation("author", "paper", 6.0, 0.8, from_target=True, block_edges=100))
    assert len(blocks) > 10
    for got, expected in zip((np.concatenate(ends) for ends in zip(*blocks)), want):
        assert np.array_equal(got, expected)
    # and the edge stream goes on to the next relation where it would have
    assert whole.rng.random() == blocked.rng.random()
