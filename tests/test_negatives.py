"""Negative edges for link prediction: uniform draws of the right node type, deterministic by seed, and the
real-edge check in one process (asked of the owners on 2 ranks: tests/test_typed_runtime.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.runtime.csr import LocalCSR
from stages.runtime.negatives import EdgeMembership, NegativeDraws, has_local_edge
from stages.runtime.typed_rows import TypeIndex
from storage.schema import RangeTable
from tests._typed_worker import membership_queries, membership_truth, typed_graph


@pytest.fixture(scope="module")
def graph():
    return typed_graph()


def test_membership_in_one_process(graph):
    src, dst, edge_type = membership_queries(graph)
    csr = LocalCSR.from_numpy(graph.indptr, graph.indices, num_edge_types=graph.schema.num_edge_types)
    got = EdgeMembership(csr, [0, graph.schema.num_nodes], edge_type).contains(src, dst)
    want = membership_truth(graph, src, dst, edge_type)
    assert torch.equal(got, want) and bool(want[:200].all()) and 0 < int(got.sum()) < 400
    assert torch.equal(has_local_edge(csr, src, dst, edge_type), want)


def test_negatives_are_uniform_over_the_destination_type_and_follow_the_seed():
    table = RangeTable.from_counts(np.array([[3, 50], [4, 30]]))   # 2 parts, types a (7 nodes) and b (80)
    index = TypeIndex(table)
    draws = NegativeDraws(87, index=index, node_type=0)
    gid = draws.draw((2000, 3), torch.Generator().manual_seed(1))
    node_type, tgid = index.locate(gid.view(-1))
    assert gid.shape == (2000, 3) and bool((node_type == 0).all())
    assert torch.bincount(tgid, minlength=7).min() > 600   # every one of the 7 drawn ~857 times
    again = draws.draw((2000, 3), torch.Generator().manual_seed(1))
    assert torch.equal(gid, again) and not torch.equal(gid, draws.draw((2000, 3), torch.Generator().manual_seed(2)))
    plain = NegativeDraws(87).draw((500,), torch.Generator().manual_seed(0))
    assert int(plain.min()) >= 0 and int(plain.max()) < 87
    with pytest.raises(ValueError, match="need both"):
        NegativeDraws(87, index=index)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_negatives_on_a_cuda_index_from_a_cpu_generator():
    index = TypeIndex(RangeTable.from_counts(np.array([[3, 50], [4, 30]])), "cuda")
    gid = NegativeDraws(87, index=index, node_type=1).draw((100, 2), torch.Generator().manual_seed(0))
    assert gid.device.type == "cuda" and bool((index.locate(gid.view(-1))[0] == 1).all())
