"""stages.runtime.segments: the GPU way (no host synchronisation) gives the CPU way's tensors, both run here."""

import pytest
import torch

import stages.runtime.segments as segments
from stages.runtime.segments import bin_counts, expand_rows, offsets_of, repeat_positions, stable_order, steps_of


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


def test_a_run_first_made_under_inference_mode_serves_autograd_after_it(monkeypatch):
    """The infer stage asks first under ``torch.inference_mode``; a training step in the same process later saves a
    view of the same run for backward (an inference tensor there raises)."""
    monkeypatch.setattr(segments, "_IOTA", {})
    with torch.inference_mode():
        steps_of(0, 4, "cpu")
    w = torch.ones(8, 2, requires_grad=True)
    w.index_select(0, steps_of(1, 3, "cpu")).sum().backward()
    assert w.grad is not None and w.grad[1:3].eq(1).all() and not steps_of(0, 1, "cpu").is_inference()


@pytest.mark.parametrize("dtype", [torch.int32, torch.long])
def test_steps_are_aranges_viewed_from_one_kept_run(dtype):
    first = steps_of(0, 10, "cpu", dtype)
    assert torch.equal(first, torch.arange(10, dtype=dtype))
    assert torch.equal(steps_of(3, 7, "cpu", dtype), torch.arange(3, 7, dtype=dtype))
    assert steps_of(0, 0, "cpu", dtype).numel() == 0
    run = steps_of(0, 1, "cpu", dtype)._base
    assert run is not None and steps_of(5, 9, "cpu", dtype)._base is run, "a view, no new tensor"
    longer = steps_of(100, 200_000, "cpu", dtype)   # grows the run
    assert torch.equal(longer, torch.arange(100, 200_000, dtype=dtype))
    assert torch.equal(first, torch.arange(10, dtype=dtype)), "views of the old run stay valid"
    assert any(kept is run for kept in segments._IOTA_KEPT), "a replaced run is kept, never handed back"
    past = steps_of(5, segments._IOTA_MAX + 3, "cpu", dtype)   # past the bound: a plain arange, not kept
    assert past._base is None and torch.equal(past[-2:], torch.tensor([segments._IOTA_MAX + 1,
                                                                         segments._IOTA_MAX + 2], dtype=dtype))
    assert sum(kept.numel() for kept in segments._IOTA_KEPT if kept.dtype == dtype) <= 2 * segments._IOTA_MAX


def test_expand_rows_with_the_callers_first_slots():
    count = torch.tensor([2, 0, 3, 1])
    row_start = torch.tensor([10, 50, 20, 7])
    total = int(count.sum())
    plain = expand_rows(count, row_start, total, by_repeat=True)
    given = expand_rows(count, row_start, total, first_slot=torch.cumsum(count, 0) - count, by_repeat=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, given, strict=True))
    assert plain[1].tolist() == [10, 11, 20, 21, 22, 7]


@pytest.mark.parametrize("dtype", [torch.int32, torch.long])
def test_offsets_are_the_running_sum_after_a_zero(dtype):
    count = torch.tensor([3, 0, 2, 5], dtype=dtype)
    assert offsets_of(count).tolist() == [0, 3, 3, 5, 10] and offsets_of(count).dtype == torch.long
    assert offsets_of(count[:0]).tolist() == [0]
