"""Work items on a few threads with their results in item order: for writes that wait on the disk, where the items
are independent (distinct Zarr chunks) but what follows them must see them in order (Parquet row groups). Zarr
3.1 encodes (crc32c) on its one event-loop thread; what the threads overlap is the copies into their chunks and the
stores' file writes."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# chunk writes at once, one a core this process may run on, at most 4: 2 cores, 614 MB in 12 Zarr chunks took
# 1.59-1.82 s on 1 thread, 1.05-1.28 on 2 and 1.06-1.22 on 4 (benchmarks/RESULTS.md, session 32)
WRITE_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
                           os.cpu_count() or 1))


def in_order(fn: Callable[[T], R], items: Iterable[T], threads: int = WRITE_THREADS) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` for each item in turn, ``threads`` items under way at once and at most ``2 * threads``
    begun and not yet handed on, so at most ``2 * threads + 1`` results alive with the one the caller holds. An
    item's error cancels those not yet begun and comes out here, at its turn; one thread runs the items here, in
    turn, with no pool."""
    if threads <= 1:
        for item in items:
            yield item, fn(item)
        return
    pending: deque[tuple[T, Future[R]]] = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="in-order") as pool:
        try:
            for item in items:
                pending.append((item, pool.submit(fn, item)))
                if len(pending) >= 2 * threads:
                    first, done = pending.popleft()
                    yield first, done.result()
            while pending:
                first, done = pending.popleft()
                yield first, done.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
