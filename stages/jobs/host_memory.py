"""Host memory for the training step: big tensors on transparent huge pages (2 MiB) instead of 4 KiB pages.

glibc serves allocations above its mmap threshold (at most 32 MiB) with fresh ``mmap`` pages and unmaps them on
``free``, so a products-scale step, which allocates tens of such tensors (a layer-0 activation is 154 k x 256 float32
= 158 MiB), faults every page of each of them in again every batch: 38.7 k page faults and 86 ms for one ``h * 2``
on that tensor, 341 faults and 23 ms on huge pages. torch's CPU allocator asks the kernel for huge pages (``madvise``)
when ``THP_MEM_ALLOC_ENABLE=1`` is in the environment at the process's first CPU allocation, which importing
torch_geometric already makes: so the variable is set for the ranks by the train stage (``huge_page_env``), not by
the rank itself. On a products batch (``benchmarks/bench_batch.py``, median): 1.40 -> 1.04 s per step at 1 thread,
1.90 -> 1.22 s at 2.

Measured and not kept: raising glibc's mmap and trim thresholds (``mallopt``) so that freed blocks stay on the heap:
1.20 -> 1.06 s per step, but torch's 64-byte-aligned allocations do not fit the blocks freed by same-sized ones, so
the heap grew to 14 of those blocks (2.2 GB for one 158 MB tensor allocated in a loop) before it reused them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["THP_ENV", "huge_page_env", "huge_pages_granted"]

THP_ENV = "THP_MEM_ALLOC_ENABLE"   # c10's switch: madvise(MADV_HUGEPAGE) on CPU allocations of 2 MiB and more
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_page_env() -> dict[str, str]:
    """The environment entry that puts a new process's big CPU tensors on huge pages; a value the user set wins."""
    return {THP_ENV: os.environ.get(THP_ENV, "1")}


def huge_pages_granted() -> bool:
    """Whether the kernel grants transparent huge pages on request: THP mode ``always`` or ``madvise`` (Linux)."""
    try:
        return "[never]" not in _THP_MODE.read_text()
    except OSError:
        return False
