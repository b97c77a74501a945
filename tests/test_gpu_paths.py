"""The [7/7] paths that run on the device when a rank has a GPU (run by ``make gpu-check``, skipped without CUDA):
decoding stored rows on the GPU, edge ids and edge rows from a CSR in device memory, weighted draws there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.features.schemes import fit_codec
from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler
from stages.runtime.sampling.uniform import sample_edges_with_counts
from tests._edge_worker import edge_truth
from tests._sampler_graphs import assert_same_batches, power_law_graph

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "float8_e4m3"])
def test_rows_decode_on_the_gpu_as_on_the_cpu(dtype: str):
    x = np.random.default_rng(0).normal(size=(500, 9)).astype(np.float32) * 7
    codec = fit_codec(x, dtype, "none")
    held = codec.encode(torch.from_numpy(x)).view(codec.carrier)   # as stores, caches and the exchange hold them
    on_gpu = codec.to("cuda").decode(held.cuda())
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
    assert torch.equal(on_gpu.cpu(), codec.decode(held))


def test_edge_ids_and_rows_from_a_csr_in_device_memory():
    indptr, indices = power_law_graph()
    truth = edge_truth(indptr, indices)
    smp = NeighborSampler(LocalCSR.from_numpy(indptr, indices, device="cuda"), [5, 3],
                          generator=torch.Generator(device="cuda").manual_seed(0))
    smp.with_edges, smp.edge_attr = True, torch.from_numpy(truth).cuda()
    batch = smp.sample(torch.arange(0, 40, device="cuda"))
    assert batch.e_id.device.type == batch.edge_attr.device.type == "cuda"
    src_gid, dst_gid = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    row = torch.from_numpy(truth).cuda()[batch.e_id]
    assert torch.equal(row[:, 0].long(), src_gid) and torch.equal(row[:, 1].long(), dst_gid)
    assert torch.equal(batch.edge_attr, row)


@pytest.mark.parametrize("indices_dtype", [np.int64, np.int32])
def test_a_csr_in_pinned_host_memory_samples_as_the_one_in_device_memory(indices_dtype):
    """Issue [4/5] item 7: the device reads the pinned CSR in place (UVA); the same seeds and generator give the
    same batches as the CSR copied into device memory, and the pinned one holds no device memory."""
    indptr, indices = power_law_graph()
    host = LocalCSR.from_numpy(indptr, indices.astype(indices_dtype))
    before = torch.cuda.memory_allocated()
    pinned = host.pinned_on(torch.device("cuda"))
    assert torch.cuda.memory_allocated() == before and pinned.device.type == "cuda"
    assert pinned.indices.dtype == host.indices.dtype and torch.equal(pinned.indptr.cpu(), host.indptr)
    assert_same_batches(host.to_device("cuda"), pinned, torch.device("cuda"))


@pytest.mark.parametrize("replace", [True, False])
def test_weighted_draws_on_the_gpu_follow_the_weights(replace: bool):
    weight = torch.tensor([1.0, 0.0, 2.0, 3.0, 4.0])
    csr = LocalCSR.from_numpy(np.array([0, 5]), np.array([1, 2, 3, 4, 5]), device="cuda").with_edge_weight(
        weight.cuda())
    n = 20_000
    count, _, edge_idx = sample_edges_with_counts(csr, torch.zeros(n, dtype=torch.long, device="cuda"), 1,
                                                  replace=replace, generator=torch.Generator(device="cuda")
                                                  .manual_seed(0))
    assert edge_idx.device.type == "cuda" and int(count.sum()) == n
    freq = torch.bincount(edge_idx.cpu(), minlength=5).double() / n
    prob = weight.double() / weight.sum()
    assert torch.all((freq - prob).abs() <= 5 * torch.sqrt(prob * (1 - prob) / n) + 1e-12), (freq, prob)
