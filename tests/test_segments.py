"""stages.runtime.segments: the GPU way (no host synchronisation) gives the CPU way's tensors, both run here."""

import pytest
import torch

from stages.runtime.segments import bin_counts, expand_rows, repeat_positions, stable_order


def _counts(seed: int, rows: int, empty_share: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    count = torch.randint(1, 9, (rows,), generator=gen)
    return torch.where(torch.rand(rows, generator=gen) < empty_share, 0, count)


@pytest.mark.parametrize("rows,empty_share", [(0, 0.0), (1, 0.0), (1, 1.0), (50, 0.0), (200, 0.5), (300, 1.0)])
def test_both_ways_expand_rows_alike(rows, empty_share):
    count = _counts(rows, rows, empty_share)
    row_start = torch.randint(0, 1000, (rows,), generator=torch.Generator().manual_seed(1))
    total = int(count.sum())
    expected_row = torch.repeat_interleave(torch.arange(rows), count)
    first_slot = torch.cumsum(count, 0) - count
    expected_idx = row_start[expected_row] + torch.arange(total) - first_slot[expected_row]
    for by_repeat in (False, True):
        row_pos, edge_idx = expand_rows(count, row_start, total, by_repeat=by_repeat)
        assert torch.equal(row_pos, expected_row) and torch.equal(edge_idx, expected_idx), by_repeat
        assert torch.equal(repeat_positions(count, total, by_repeat=by_repeat), expected_row), by_repeat


def test_bin_counts_both_ways_as_bincount():
    index = torch.randint(0, 37, (1000,), generator=torch.Generator().manual_seed(2))
    for size in (37, 50):
        expected = torch.bincount(index, minlength=size)
        for by_repeat in (False, True):
            got = bin_counts(index, size, by_repeat=by_repeat)
            assert got.dtype == torch.long and torch.equal(got, expected)
    assert torch.equal(bin_counts(index[:0], 4, by_repeat=True), torch.zeros(4, dtype=torch.long))


def test_stable_order_with_a_known_bound_or_without():
    key = torch.randint(0, 20, (500,), generator=torch.Generator().manual_seed(3))
    expected = torch.sort(key, stable=True).indices
    for bound in (None, 20, 2**31, 2**40):
        assert torch.equal(stable_order(key, bound), expected)
    wide = key + 2**33   # keys past int32: sorted as int64, not wrapped
    assert torch.equal(stable_order(wide), expected)
    assert stable_order(key[:0]).numel() == 0

