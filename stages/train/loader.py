"""The loader room: a rank's seed gids -> sampled batch -> gathered feature rows -> labels, in lockstep batches.

Lockstep contract, for every pass (a training epoch, a validation or test pass):

- every rank runs the same number of batches: the count is agreed by one collective when the pass starts
  (``equal_batch_count``, the largest rank's); a rank with fewer seeds pads with recycled seeds (training) or with
  empty batches (evaluation);
- every batch is a collective: ``sample`` and ``gather_rows`` exchange with every other rank (``dist_sampler``,
  ``dist_features``), so each rank runs every batch of a pass it starts, in order, empty ones included.

The loader hands ``stages.train.loop`` the three callables of its seam (``Sample``, ``GatherRows``, ``LabelOf``)
and the seed batches, so that one ``train_epoch`` serves this rank and the benchmark's single-process baseline.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from stages.runtime.dist_sampler import DistNeighborSampler, equal_batch_count, iter_equal_seed_batches
from stages.train.loop import GatherRows, LabelOf, Sample
from stages.train.rank_data import RankData


class NodeLoader:
    """Batches of one rank's own nodes: seeds (shuffled by ``shuffle_gen``), sampled with ``sampler_gen``."""

    def __init__(self, data: RankData, fanouts: Sequence[int], batch_size: int, *, shuffle_gen: torch.Generator,
                 sampler_gen: torch.Generator) -> None:
        self.split_gid, self.batch_size, self.shuffle_gen = data.split_gid, batch_size, shuffle_gen
        self.sampler = DistNeighborSampler(data.csr, data.bounds, fanouts, generator=sampler_gen)
        self.sample: Sample = self.sampler.sample            # seed gids -> Data (n_id gids, seeds first)
        self.gather_rows: GatherRows = data.features.gather  # n_id gids -> feature rows on the device
        self.label_of: LabelOf = data.label_of               # seed gids -> labels on the device
        # this rank's real train batches; the padding batches after them count in no loss or accuracy
        self.num_real_train_batches = math.ceil(self.split_gid["train"].numel() / batch_size)

    def train_batches(self) -> Iterator[Tensor]:
        """One epoch of this rank's shuffled train seed gids, ``equal_batch_count`` batches (padding last)."""
        return iter_equal_seed_batches(self.split_gid["train"], self.batch_size, generator=self.shuffle_gen)

    def eval_batches(self, split: str) -> list[Tensor]:
        """The split's own nodes in order, then empty batches up to the largest rank's count."""
        seed_gid, bs = self.split_gid[split], self.batch_size
        total = equal_batch_count(seed_gid.numel(), bs)
        return [seed_gid[b * bs:(b + 1) * bs] for b in range(total)]
