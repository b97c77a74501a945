"""Index helpers over rows of counted slots (a CSR's rows, a hop's sampled edges), each with a CPU and a GPU way.

The two ways give the same tensors; they differ in what they cost where:

- on a CPU, ``repeat_interleave`` is a slow serial kernel (~30x the running sums below), so slots take their row
  from a running sum of per-slot steps, with a ``nonzero`` over the rows (free on a CPU);
- on a GPU, ``nonzero``, ``bincount`` and an ``int(t.max())`` each stop the host until the device catches up (a
  stream synchronisation), and every op is a kernel launch, the products batch's bottleneck (benchmarks/RESULTS.md,
  [4/5]: 655 launches and 37 synchronisations a batch): ``repeat_interleave`` with its output size given, and
  counts by ``index_add_``, need neither.

The GPU way is chosen by the tensors' device; ``by_repeat`` forces it (tests compare the two ways on a CPU).
``steps_of`` hands out ``arange`` runs as views of one kept run, without a launch.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["bin_counts", "expand_rows", "offsets_of", "repeat_positions", "stable_order", "steps_of"]


def _gpu_way(t: Tensor, by_repeat: bool | None) -> bool:
    return t.is_cuda if by_repeat is None else by_repeat


def _row_starts(count: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Non-empty rows, their counts and their first output slots (exclusive running sum)."""
    nonempty_row_pos = torch.nonzero(count).squeeze(1)
    nonempty_count = count.index_select(0, nonempty_row_pos)
    return nonempty_row_pos, nonempty_count, torch.cumsum(nonempty_count, 0) - nonempty_count


def repeat_positions(count: Tensor, total: int, *, by_repeat: bool | None = None) -> Tensor:
    """``repeat_interleave(arange(len(count)), count)``, ``total = count.sum()`` (int64 [total]: each slot's row).

    CPU: a running sum of per-slot steps that are 0 except at a non-empty row's first slot, where they jump to that
    row."""
    if _gpu_way(count, by_repeat):
        return torch.repeat_interleave(count, output_size=total)
    nonempty_row_pos, _, start_slot_pos = _row_starts(count)
    step = torch.zeros(total, dtype=torch.long, device=count.device)
    step.scatter_(0, start_slot_pos, torch.diff(nonempty_row_pos, prepend=nonempty_row_pos.new_zeros(1)))
    return torch.cumsum(step, 0)


def expand_rows(count: Tensor, row_start: Tensor, total: int, *, first_slot: Tensor | None = None,
                by_repeat: bool | None = None) -> tuple[Tensor, Tensor]:
    """For ``count[r]`` slots per row: each slot's row and ``row_start[r] + its rank within the row``.
    ``first_slot``: each row's first slot (``cumsum(count) - count``), when the caller has it.

    CPU: the second is the same running sum as in ``repeat_positions``, with steps of 1 inside a row and a jump
    from the previous non-empty row's last slot to the row's ``row_start`` at its first slot."""
    if _gpu_way(count, by_repeat):
        row_pos = torch.repeat_interleave(count, output_size=total)
        if first_slot is None:
            first_slot = offsets_of(count)[:-1]
        return row_pos, (row_start - first_slot).index_select(0, row_pos) + steps_of(0, total, count.device)
    nonempty_row_pos, nonempty_count, start_slot_pos = _row_starts(count)
    device = count.device
    row_step = torch.zeros(total, dtype=torch.long, device=device)
    row_step.scatter_(0, start_slot_pos, torch.diff(nonempty_row_pos, prepend=nonempty_row_pos.new_zeros(1)))
    ne_row_start = row_start.index_select(0, nonempty_row_pos)
    ne_row_last = ne_row_start + nonempty_count - 1
    edge_step = torch.ones(total, dtype=torch.long, device=device)
    edge_step.scatter_(0, start_slot_pos, torch.cat([ne_row_start[:1], ne_row_start[1:] - ne_row_last[:-1]]))
    return torch.cumsum(row_step, 0), torch.cumsum(edge_step, 0)


# 0, 1, 2, ... per device and dtype, as long as the longest run asked for yet, up to _IOTA_MAX; every run made is
# kept (_IOTA_KEPT), so memory a stream may still read is never handed back: at most 2 x _IOTA_MAX entries each
_IOTA: dict[tuple[torch.device, torch.dtype], Tensor] = {}
_IOTA_KEPT: list[Tensor] = []
_IOTA_MAX = 1 << 20   # 8 MiB of int64; a products batch's longest run, hop 3's ~750 k edges, fits


def steps_of(start: int, stop: int, device: torch.device | str, dtype: torch.dtype = torch.long) -> Tensor:
    """``arange(start, stop)`` as a view of one kept run per device and dtype: no kernel, where ``arange`` is one
    launch (a hop asks for 2-4, of a batch's ~340 launches on a GPU). Read only: callers must not write to it.

    The run grows by doubling when a longer one is asked for, up to ``_IOTA_MAX`` (longer runs are a plain
    ``arange``: one launch beside that much work is nothing). A GPU's growth waits for its fill, so any stream may
    read the new run at once; the runs it replaces are kept, not freed: a view on another stream (the prefetch
    producer's side stream and the training stream share them) may still be read by a kernel in flight, and the
    allocator would otherwise hand that memory to the growing stream."""
    if stop > _IOTA_MAX:
        return torch.arange(start, stop, dtype=dtype, device=device)
    key = (torch.device(device), dtype)
    iota = _IOTA.get(key)
    if iota is None or iota.numel() < stop:
        size = min(_IOTA_MAX, max(stop, 2 * (0 if iota is None else iota.numel()), 1024))
        # a normal tensor even when first asked for under inference_mode (the infer stage's): an inference tensor
        # kept here would fail a later training step in the same process that saves a view for backward
        with torch.inference_mode(False):
            iota = torch.arange(size, dtype=dtype, device=key[0])
        if iota.is_cuda:
            torch.cuda.current_stream(iota.device).synchronize()
        _IOTA_KEPT.append(iota)
        _IOTA[key] = iota
    return iota[start:stop]


def stable_order(key_pos: Tensor, bound: int | None = None) -> Tensor:
    """The stable sorting permutation of non-negative positions, all below ``bound`` when the caller knows one.

    Sorted as int32 where they fit: on a CPU 0.8 ms for the 168 k entries of a products batch's layer 1, where
    int64 keys took 25 ms (torch picks a radix sort for the narrower keys). Without ``bound`` the fit is read off
    the keys' maximum, a synchronisation on a GPU."""
    if bound is None:
        bound = int(key_pos.max()) + 1 if key_pos.numel() else 0
    if bound <= 2**31:
        key_pos = key_pos.to(torch.int32)
    return torch.sort(key_pos, stable=True).indices


def bin_counts(index: Tensor, size: int, *, by_repeat: bool | None = None) -> Tensor:
    """``bincount(index, minlength=size)`` for ``index`` in ``[0, size)``: int64 [size]. On a GPU by
    ``index_add_`` (``bincount`` there reads the maximum back to the host first)."""
    if _gpu_way(index, by_repeat):
        ones = steps_of(1, 2, index.device).expand(index.numel())   # the kept run's 1: no launch
        return torch.zeros(size, dtype=torch.long, device=index.device).index_add_(0, index, ones)
    return torch.bincount(index, minlength=size)


def offsets_of(count: Tensor) -> Tensor:
    """``[0, cumsum(count)...]`` (int64, as ``cumsum`` sums integers): the CSR row offsets of rows of ``count``
    entries (len + 1), the running sum written in place after the leading 0 (2 ops, where ``cat`` of a zero and the
    sum takes 3)."""
    offsets = torch.zeros(count.numel() + 1, dtype=torch.long, device=count.device)
    torch.cumsum(count, 0, out=offsets[1:])
    return offsets
