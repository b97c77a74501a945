"""The loader room: a rank's seed gids -> sampled batch -> gathered feature rows, in lockstep batches (the labels are
the task's: ``stages.train.tasks``).

Lockstep contract, for every pass (a training epoch, a validation or test pass):

- every rank runs the same number of batches: the count is agreed by one collective when the pass starts
  (``equal_batch_count``, the largest rank's); a rank with fewer seeds pads with recycled seeds (training) or with
  empty batches (evaluation);
- every batch is a collective: ``sample`` and ``gather_rows`` exchange with every other rank (``dist_sampler``,
  ``dist_features``), so each rank runs every batch of a pass it starts, in order, empty ones included. They run
  on ``RankData.group``: a prefetching producer thread's own group (``stages.train.rank.prefetch``), which keeps them
  apart from the main thread's collectives.

The loader hands ``stages.train.rank.loop`` the two callables of its seam (``Sample``, ``GatherRows``) and the batches
of the task's items, so that one ``train_epoch`` serves this rank and the benchmark's single-process baseline.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.dist_features import DistFeatures
from stages.runtime.sampling.dist_sampler import DistNeighborSampler, equal_batch_count, iter_equal_seed_batches
from stages.runtime.sampling.fanouts import Fanout
from stages.runtime.sampling.sampler import check_seed_range
from stages.runtime.typed_batch import set_types
from stages.runtime.typed_rows import TypedRows
from stages.train.rank.rank_data import RankData


class NodeLoader:
    """Batches of one rank's own nodes: seeds (shuffled by ``shuffle_gen``), sampled with ``sampler_gen``."""

    def __init__(self, data: RankData, fanouts: Sequence[Fanout], batch_size: int, *, shuffle_gen: torch.Generator,
                 sampler_gen: torch.Generator, epoch_items: int | None = None,
                 items: Mapping[str, Tensor] | None = None, items_are_seeds: bool = True) -> None:
        """``items``: the task's items per split (``Task.seeds``; default: the rank's seed gids,
        ``data.split_gid``); ``epoch_items``: train on only so many of this rank's train items an epoch, a fresh
        shuffled sample of them each epoch (None: all); ``items_are_seeds``: ``sample`` is only ever called with
        batches of the items themselves (``Task.seeds_are_items``), which are then checked once here, in range
        and unique, instead of in every batch (two host reads a batch on a GPU)."""
        # gids under task=node, link items (columns of the rank's positive-edge table) under task=link: docs §4
        self.split_items = dict(data.split_gid if items is None else items)
        self.batch_size, self.shuffle_gen = batch_size, shuffle_gen
        # the batches' collectives (sampling, the epoch's batch count) on the data's group: a prefetching
        # producer's own (``stages.train.rank.prefetch``)
        self.group = data.group
        num_edges = None if data.edge_bounds is None else int(data.edge_bounds[-1])
        self.sampler = DistNeighborSampler(data.csr, data.bounds, fanouts, generator=sampler_gen, group=data.group,
                                           num_edges=num_edges)
        self.items_are_seeds = items_are_seeds
        if items_are_seeds:
            for split, gid in self.split_items.items():
                check_seed_items(split, gid, self.sampler.num_nodes)
        self.edges = data.edges
        self.degrees = data.degrees
        # set when the model needs ``batch.deg`` (``stages.train.models.model.needs_degrees``): the same on every rank,
        # as the attachment is a collective
        self.attach_degrees = False
        # set when the model takes edge features (``stages.train.models.plugins.edge_dim_for``): batches then carry
        # ``e_id`` and ``edge_attr``; the same on every rank (two more exchanges a hop in the sampler)
        self.attach_edges = False
        self.features = data.features                        # rows in the store's dtype, on the device
        # this rank's real train batches; the padding batches after them count in no loss or accuracy
        self.epoch_items = epoch_items
        num_train = self.split_items["train"].numel()
        epoch_train = num_train if epoch_items is None else min(num_train, epoch_items)
        self.num_real_train_batches = math.ceil(epoch_train / batch_size)

    def sample(self, seed_gid: Tensor) -> Data:
        """Seed gids -> sampled batch (``n_id`` gids, seeds first; the ``Sample`` of ``stages.train.rank.loop``), with
        ``batch.deg`` when ``attach_degrees``, ``batch.e_id`` and ``batch.edge_attr`` when ``attach_edges``; a typed
        graph's with its node and edge types (``set_types``; ``edge_type`` per edge comes from the sampler). A
        collective."""
        if self.attach_edges and self.sampler.edge_attr is None:
            if self.edges is None:
                raise ValueError("this rank's graph has no edge features (RankData.edges)")
            self.sampler.edge_attr = self.edges.own_attr.to(self.sampler.device)   # they ride with the answers
        self.sampler.with_edges = self.attach_edges
        batch = self.sampler.sample(seed_gid, checked=self.items_are_seeds)
        if isinstance(self.features, TypedRows):
            set_types(batch, self.features.index.locate(batch.n_id)[0], self.sampler.num_edge_types)
        if self.attach_degrees:
            if self.degrees is None:
                raise ValueError("this rank's data has no degree path (RankData.degrees)")
            with_degrees(batch, self.degrees)
        return batch

    def gather_rows(self, n_id: Tensor) -> Tensor | dict[str, Tensor]:
        """``n_id`` gids -> float32 feature rows on the device (the ``GatherRows`` of ``stages.train.rank.loop``); a
        typed graph's as ``{node type: rows of its nodes, in batch order}``, learnt embeddings for featureless
        types (leaves whose gradients ``step_embeddings`` sends to their owners).

        Rows are cached and exchanged in the store's storage dtype (float16 or bfloat16: half of float32's bytes;
        int8, float8 or 1-byte bool/int: a quarter; ``stages.runtime.feature_codec``) and decoded here, once, after
        the exchange, by ``DistFeatures.decode``; no copy for float32.
        """
        if isinstance(self.features, TypedRows):
            _, rows = self.features.gather(n_id)
            return rows
        return self.features.decode(self.features.gather(n_id))

    def step_embeddings(self) -> None:
        """After each training batch's optimiser step: the learnt embeddings' sparse step (a collective; nothing on
        a graph without featureless types)."""
        if isinstance(self.features, TypedRows):
            self.features.step_embeddings()

    def train_batches(self) -> Iterator[Tensor]:
        """One epoch of this rank's shuffled train items (``epoch_items`` of them), ``equal_batch_count`` batches
        (padding last); the count is agreed when iteration starts (a collective on ``group``: whichever thread
        iterates runs it)."""
        return iter_equal_seed_batches(self.split_items["train"], self.batch_size, generator=self.shuffle_gen,
                                       group=self.group, limit=self.epoch_items)

    def eval_batches(self, split: str) -> list[Tensor]:
        """The split's own items in order, then empty batches up to the largest rank's count."""
        items, bs = self.split_items[split], self.batch_size
        total = equal_batch_count(items.numel(), bs)
        return [items[b * bs:(b + 1) * bs] for b in range(total)]


def check_seed_items(split: str, gid: Tensor, num_nodes: int) -> None:
    """ValueError unless a split's seed gids lie in the graph and are unique: what every batch of them then is
    (the batches are slices of one permutation, padded with other items of the rank's own)."""
    if gid.numel() == 0:
        return
    check_seed_range(gid, num_nodes, f"the {split} split's seed gids")
    if torch.unique(gid).numel() != gid.numel():
        raise ValueError(f"the {split} split repeats a node: seed gids of a batch must be unique; deduplicate it")


def with_degrees(batch: Data, degrees: DistFeatures) -> Data:
    """Attach ``batch.deg``: the true in-degree + 1 of each ``n_id`` position, float32 on the training device, own
    nodes' from this rank's CSR and remote ones' from their owners (``rank_data.degree_path``). A collective."""
    batch.deg = degrees.gather(batch.n_id).view(-1)
    return batch
