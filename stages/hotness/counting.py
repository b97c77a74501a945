"""Pre-sampling: how often each gid's feature row is requested by the batches of one partition's seeds.

Counting real requests (rather than GLT's analytic access probability, which saturates at 1.0 for many nodes of
a power-law graph) ranks better and runs on CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stages.runtime.sampler import NeighborSampler, iter_seed_batches
from storage.progress import progress as tqdm


def count_requests(sampler: NeighborSampler, seed_gid: Tensor, *, batch_size: int, epochs: int,
                   generator: torch.Generator, desc: str = "pre-sample", progress: bool = False) -> Tensor:
    """int64 [N]: in how many batches' ``n_id`` each gid appeared, over ``epochs`` shuffled epochs.

    ``generator`` draws the neighbours as well as the shuffles: a plan is reproducible from the stage's seed (the
    draws came from torch's global generator until the golden test of the homogeneous artifacts caught two runs
    planning differently)."""
    previous, sampler.generator = sampler.generator, generator
    try:
        return _count(sampler, seed_gid, batch_size=batch_size, epochs=epochs, generator=generator, desc=desc,
                      progress=progress)
    finally:
        sampler.generator = previous


def _count(sampler: NeighborSampler, seed_gid: Tensor, *, batch_size: int, epochs: int,
           generator: torch.Generator, desc: str, progress: bool) -> Tensor:
    count_gid = torch.zeros(sampler.num_nodes, dtype=torch.long)
    num_batches = epochs * -(-seed_gid.numel() // batch_size)
    with tqdm(total=num_batches, desc=desc, unit="batch", disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            for batch_gid in iter_seed_batches(seed_gid, batch_size, generator=generator):
                n_id = sampler.sample(batch_gid).n_id
                count_gid.index_add_(0, n_id, torch.ones_like(n_id))
                bar.update()
    return count_gid
