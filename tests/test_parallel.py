"""``storage.parallel.in_order``: items run on threads come out in order, a bounded number held, an error stops the
rest; ``write_array`` on threads writes the bytes it writes alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from storage.parallel import in_order
from storage.zarr_io import open_group, write_array


def test_chunks_written_on_threads_come_out_in_order_and_few_at_a_time():
    lock, state = threading.Lock(), {"begun": 0, "yielded": 0, "held": 0}
    rng = np.random.default_rng(0)
    delays = rng.uniform(0, 0.004, 40)

    def write(start: int) -> dict[str, np.ndarray]:
        with lock:
            state["begun"] += 1
            state["held"] = max(state["held"], state["begun"] - state["yielded"])
        time.sleep(float(delays[start // 10]))   # later chunks often finish first
        return {"pred": np.array([start])}

    out = []
    for start, columns in in_order(write, range(0, 400, 10), threads=3):
        out.append((start, int(columns["pred"][0])))
        with lock:
            state["yielded"] += 1
    assert out == [(s, s) for s in range(0, 400, 10)]
    assert state["held"] <= 2 * 3   # begun but not yet handed on: the columns held at once


def test_a_chunks_error_comes_out_and_the_chunks_not_begun_are_not_written():
    """2 threads, 4 items submitted: item 0 fails at once, items 1 and 2 hold both threads until well after the
    error came out, so item 3 is still queued then: cancelled, it never begins."""
    begun: list[int] = []
    hold = threading.Event()
    threading.Timer(0.5, hold.set).start()   # lets items 1 and 2 end (the pool waits for them)

    def write(start: int) -> dict[str, np.ndarray]:
        begun.append(start)
        if start == 0:
            raise OSError("disk full")
        hold.wait(5)
        return {}

    with pytest.raises(OSError, match="disk full"):
        for _ in in_order(write, range(100), threads=2):
            pass
    assert sorted(begun) == [0, 1, 2]


def test_one_thread_runs_the_items_here_in_turn():
    seen: list[str] = []
    out = list(in_order(lambda i: seen.append(threading.current_thread().name) or i * i, range(5), threads=1))
    assert out == [(i, i * i) for i in range(5)] and set(seen) == {threading.current_thread().name}


@pytest.mark.parametrize("source", ["memory", "memmap"])
def test_write_array_on_threads_writes_the_same_bytes(tmp_path: Path, source: str, monkeypatch):
    rows = np.random.default_rng(0).standard_normal((1000, 5))   # float64, stored as float32: a cast per chunk
    if source == "memmap":
        mapped = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype=rows.dtype, shape=rows.shape)
        mapped[:] = rows
        rows = mapped
    import storage.zarr_io

    writers: dict[int, set[str]] = {}

    def spy(fn, items, threads):   # in_order, noting which threads wrote the chunks
        def write(item):
            writers.setdefault(threads, set()).add(threading.current_thread().name)
            return fn(item)
        return in_order(write, items, threads)
    monkeypatch.setattr(storage.zarr_io, "in_order", spy)
    files = []
    for threads in (1, 3):
        folder = tmp_path / f"t{threads}.zarr"
        write_array(open_group(str(folder), mode="w"), "x", rows, chunk_rows=37, dtype=np.float32, threads=threads)
        files.append({str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()})
        np.testing.assert_array_equal(open_group(str(folder))["x"][:], rows.astype(np.float32))
    assert files[0] == files[1] and len(files[0]) > 27   # 28 chunks and the metadata
    assert writers[1] == {threading.current_thread().name} and len(writers[3]) > 1, writers
