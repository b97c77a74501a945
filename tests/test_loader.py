"""The loader room (``stages.train.rank.loader``): what it checks once so that its batches need not."""

from __future__ import annotations

import pytest
import torch

from tests._block_graphs import one_rank_data


def test_the_loader_checks_a_splits_seed_items_once(one_rank_group):
    """With ``items_are_seeds`` (node classification) the loader checks each split's gids when it is made, and its
    batches skip the sampler's per-batch checks; link items are no gids and are not checked."""
    from stages.train.rank.loader import NodeLoader

    def loader(items, are_seeds=True):
        gen = torch.Generator().manual_seed(0)
        return NodeLoader(one_rank_data(), [3, 2], 64, shuffle_gen=gen, sampler_gen=gen, items=items,
                          items_are_seeds=are_seeds)
    n = one_rank_data().csr.num_nodes
    with pytest.raises(ValueError, match="the valid split repeats a node"):
        loader({"train": torch.arange(10), "valid": torch.tensor([3, 4, 3])})
    with pytest.raises(ValueError, match=rf"the test split's seed gids must lie in \[0, {n}\)"):
        loader({"train": torch.arange(10), "test": torch.tensor([3, n])})
    assert loader({"train": torch.tensor([3, n, 3])}, are_seeds=False).items_are_seeds is False
    ok = loader({"train": torch.arange(100)})
    checked = []
    original = ok.sampler.sample
    ok.sampler.sample = lambda seed_gid, **kw: checked.append(kw["checked"]) or original(seed_gid, **kw)
    ok.sample(torch.arange(5))
    assert checked == [True]
