"""The in-process export's pieces (``storage.infer_export``): chunks written on threads come out in order with their
columns, a bounded number at a time, a write's error stops the rest; a chunk's rows gathered from the parts, in
place of the copy when one part holds the chunk in order. The exports end to end: tests/test_infer.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from storage.infer_export import _gather, _pieces, written_in_order
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
    for start, columns in written_in_order(write, range(0, 400, 10), threads=3):
        out.append((start, int(columns["pred"][0])))
        with lock:
            state["yielded"] += 1
    assert out == [(s, s) for s in range(0, 400, 10)]
    assert state["held"] <= 2 * 3   # begun but not yet handed on: the columns held at once


def test_a_chunks_error_comes_out_and_the_chunks_not_begun_are_not_written():
    begun: list[int] = []

    def write(start: int) -> dict[str, np.ndarray]:
        begun.append(start)
        if start == 3:
            raise OSError("disk full")
        time.sleep(0.002)
        return {}

    got = []
    with pytest.raises(OSError, match="disk full"):
        for start, _ in written_in_order(write, range(100), threads=2):
            got.append(start)
    assert got == [0, 1, 2] and len(begun) < 20


@pytest.mark.parametrize("bounds, gid", [
    ([0, 50], np.arange(10, 40)),                               # one part, in order: the rows as read
    ([0, 20, 50], np.array([25, 3, 26, 4, 40, 19, 0, 21])),     # two parts, interleaved
    ([0, 20, 50], np.arange(30, 45)[::-1].copy()),              # one part, reversed
])
def test_a_chunks_rows_are_gathered_from_their_parts(tmp_path: Path, bounds: list[int], gid: np.ndarray):
    rows = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)   # row g holds gid g's values
    bounds_np = np.asarray(bounds)
    arrays = []
    for p in range(len(bounds) - 1):
        group = open_group(str(tmp_path / f"part-{p}.zarr"), mode="w")
        arrays.append(write_array(group, "prob", rows[bounds[p]:bounds[p + 1]], chunk_rows=7))
    got = _gather(arrays, _pieces(bounds_np, gid), np.full((gid.size, 3), -1, dtype=np.float32))
    np.testing.assert_array_equal(got, rows[gid])


def test_the_export_benchmark_times_a_tree_against_the_same_parts(tmp_path: Path):
    """``benchmarks/bench_export.py`` makes its parts once and times the export of the tree it is given."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(repo / "benchmarks" / "bench_export.py"), "--nodes", "5000", "--classes", "4",
           "--hidden", "8", "--parts", "2", "--rounds", "1", "--root", str(tmp_path)]
    runs = [json.loads(subprocess.run([*cmd, *extra], check=True, capture_output=True, text=True).stdout)
            for extra in ([], ["--tree", str(repo)])]
    assert [r["tree"] for r in runs] == ["this", str(repo)]
    assert all(r["export_s"] > 0 and r["written_MB"] > 0 and r["nodes"] == 5000 for r in runs)
    assert len(list(tmp_path.iterdir())) == 1   # one set of parts, made by the first run
