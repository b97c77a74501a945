"""What a training batch asks of a GPU, counted on the CPU (``benchmarks/bench_batch_ops.py``, issue [4/5] item 3):
on the GPU's code paths the training step reads nothing back from the device, and the sampler one value a hop for
its sizes and one for its node map (the node task's seeds are checked once a split, by the loader)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_batch_ops import count, gpu_ways  # noqa: E402 - benchmarks/ is on sys.path now


def _count(cuda_graph: str) -> dict:
    return count(argparse.Namespace(nodes=6000, batch_size=128, batches=2, warmup=2, ways="gpu", cache="all", threads=1,
                                    tree=None, cuda_graph=cuda_graph))


@pytest.fixture(scope="module")
def counts() -> dict:
    return _count("off")


def test_the_training_step_reads_nothing_back(counts):
    step = counts["step"]
    assert step["host_reads"] == 0, step["reads"]
    assert step["ops"] > 50, "the step was counted"


def test_the_sampler_reads_its_sizes_once_a_hop(counts):
    """Per hop its edge total and its node map's new nodes; none for the seeds, which the loader checked once."""
    hops = 3
    assert counts["sample"]["host_reads"] <= 2 * hops, counts["sample"]["reads"]
    assert counts["gather"] == {"ops": 1.0, "host_reads": 0, "reads": {}, "top": {"index_select": 1.0}}, \
        "every row cached on a lone rank: one gather by gid"


def test_a_graphed_step_launches_its_replay_and_a_few_copies_and_sums(counts):
    """``cuda_graph=step`` (``stages.train.rank.graphed``): the step is the buffers' three loads, one replay, the
    loss guard's copy and the running sums; the padding adds ops to the sampler's thread but no host read."""
    graphed = _count("step")
    step = graphed["step"]
    assert step["top"]["graph_replay"] == 1 and step["host_reads"] == 0, step
    assert step["ops"] <= 16, step["top"]
    assert graphed["sample"]["host_reads"] == counts["sample"]["host_reads"]


def test_the_gpu_ways_are_undone_afterwards():
    import torch

    import stages.runtime.sampling.uniform as sampler
    import stages.runtime.segments as segments

    before = (segments._gpu_way, sampler.floyd_offsets)
    with gpu_ways():
        assert segments._gpu_way(torch.zeros(1), None)
    assert (segments._gpu_way, sampler.floyd_offsets) == before
    assert not segments._gpu_way(torch.zeros(1), None)


def test_graphed_sampling_launches_its_replay_and_reads_nothing(counts):
    """``cuda_graph=auto`` (``stages.train.rank.graphed_sampling``): a batch's sampling is the seeds' load, one
    replay and the outputs' clones, with no host read anywhere in the batch; the gather is still one op."""
    graphed = _count("auto")
    sample = graphed["sample"]
    assert sample["top"]["graph_replay"] == 1 and sample["host_reads"] == 0, sample
    assert sample["ops"] <= 12, sample["top"]
    assert graphed["batch"]["host_reads"] == 0, graphed
    # the step: the graphed one's 16 at most, and 2 ops each to add the batch's two device counts (edges, padding)
    assert graphed["gather"]["ops"] == 1 and graphed["step"]["ops"] <= 20, graphed["step"]["top"]


def test_the_static_sampler_itself_reads_nothing_back():
    """What the sampling graph holds, run eagerly and counted: no host read (a replay's ops run uncounted above)."""
    import torch
    from bench_batch_ops import HOST_READS, counting_mode

    from stages.runtime.csr import LocalCSR
    from stages.runtime.sampling.static_sampler import StaticSampler
    from stages.runtime.sampling.static_shape import StaticShape
    from tests._sampler_graphs import power_law_graph

    csr = LocalCSR.from_numpy(*power_law_graph())
    for replace in (False, True):
        sampler = StaticSampler(csr, (15, 10, 5), StaticShape.bound(64, (15, 10, 5), csr.num_nodes), replace=replace)
        with gpu_ways():
            counter = counting_mode()()
            with counter:
                sampler.sample(torch.randperm(csr.num_nodes)[:64], torch.tensor(64))
        reads = {k: v for k, v in counter.ops.items() if k in HOST_READS}
        assert not reads and sum(counter.ops.values()) > 50, (reads, counter.ops)
