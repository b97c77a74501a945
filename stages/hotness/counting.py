"""Pre-sampling: how often each gid's feature row is requested by the batches of one partition's seeds.

Counting real requests (rather than GLT's analytic access probability, which saturates at 1.0 for many nodes of
a power-law graph) ranks better and runs on CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stages.runtime.sampling.sampler import NeighborSampler, iter_seed_batches
from stages.train.tasks.base import SeedsOf
from storage.progress import progress as tqdm


def count_requests(sampler: NeighborSampler, seed_gid: Tensor, *, batch_size: int, epochs: int,
                   generator: torch.Generator, desc: str = "pre-sample", progress: bool = False,
                   seeds_of: SeedsOf | None = None, limit: int | None = None) -> Tensor:
    """int64 [N]: in how many batches' ``n_id`` each gid appeared, over ``epochs`` shuffled epochs.

    ``seed_gid`` are the items training batches (node gids); ``seeds_of`` maps a batch of other items to the gids
    to sample (link prediction: positive edges' ends and their negatives, ``TaskDef.hotness_items``); ``limit``:
    an epoch is the first so many of the shuffled items (as training's ``edges_per_epoch``).

    ``generator`` draws the neighbours as well as the shuffles: a plan is reproducible from the stage's seed (the
    draws came from torch's global generator until the golden test of the homogeneous artifacts caught two runs
    planning differently)."""
    previous, sampler.generator = sampler.generator, generator
    try:
        return _count(sampler, seed_gid, batch_size=batch_size, epochs=epochs, generator=generator, desc=desc,
                      progress=progress, seeds_of=seeds_of, limit=limit)
    finally:
        sampler.generator = previous


def _count(sampler: NeighborSampler, seed_gid: Tensor, *, batch_size: int, epochs: int,
           generator: torch.Generator, desc: str, progress: bool, seeds_of: SeedsOf | None,
           limit: int | None) -> Tensor:
    count_of_gid = torch.zeros(sampler.num_nodes, dtype=torch.long)
    num_batches = epochs * -(-seed_gid[:limit].numel() // batch_size)
    with tqdm(total=num_batches, desc=desc, unit="batch", disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            for item in iter_seed_batches(seed_gid, batch_size, generator=generator, limit=limit):
                n_id = sampler.sample(item if seeds_of is None else seeds_of(item, generator)).n_id
                count_of_gid.index_add_(0, n_id, torch.ones_like(n_id))
                bar.update()
    return count_of_gid
