"""The in-process export's pieces (``storage.infer_export``): a chunk's rows gathered from the parts, as read when
one part holds the chunk in order; its benchmark. Its threads: tests/test_parallel.py; the exports end to end:
tests/test_infer.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from storage.infer_export import _gather, _pieces
from storage.zarr_io import open_group, write_array


@pytest.mark.parametrize("bounds, gid, as_read", [
    ([0, 50], np.arange(10, 40), True),                                # one part, in order: the rows as read
    ([0, 20, 50], np.array([25, 3, 26, 4, 40, 19, 0, 21]), False),     # two parts, interleaved
    ([0, 20, 50], np.arange(30, 45)[::-1].copy(), False),              # one part, reversed
])
def test_a_chunks_rows_are_gathered_from_their_parts(tmp_path: Path, bounds: list[int], gid: np.ndarray,
                                                    as_read: bool):
    rows = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)   # row g holds gid g's values
    bounds_np = np.asarray(bounds)
    arrays = []
    for p in range(len(bounds) - 1):
        group = open_group(str(tmp_path / f"part-{p}.zarr"), mode="w")
        arrays.append(write_array(group, "prob", rows[bounds[p]:bounds[p + 1]], chunk_rows=7))
    out = np.full((gid.size, 3), -1, dtype=np.float32)
    got = _gather(arrays, _pieces(bounds_np, gid), out)
    np.testing.assert_array_equal(got, rows[gid])
    assert (got is not out) == as_read   # the rows as read, not copied into out, only when one part holds them in order


def test_the_export_benchmark_times_a_tree_against_the_same_parts(tmp_path: Path):
    """``benchmarks/bench_export.py`` makes its parts once and times the export of the tree it is given."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(repo / "benchmarks" / "bench_export.py"), "--nodes", "5000", "--classes", "4",
           "--hidden", "8", "--parts", "2", "--rounds", "1", "--root", str(tmp_path)]
    other = tmp_path / "other-tree"   # another tree: a copy of this one's storage package
    shutil.copytree(repo / "storage", other / "storage", ignore=shutil.ignore_patterns("__pycache__"))
    runs = [json.loads(subprocess.run([*cmd, *extra], check=True, capture_output=True, text=True).stdout)
            for extra in ([], ["--tree", str(other)])]
    assert [r["tree"] for r in runs] == ["this", str(other)]
    assert [Path(r["storage"]).parent for r in runs] == [repo / "storage", other / "storage"]
    assert all(r["export_s"] > 0 and r["written_MB"] > 0 and r["nodes"] == 5000 for r in runs)
    assert len([p for p in tmp_path.iterdir() if p != other]) == 1   # one set of parts, made by the first run


def test_the_export_benchmark_times_a_ranks_writes(tmp_path: Path):
    """``bench_export.py --rank-writes``: a rank's hidden layer, then pred and prob, timed and cleaned away."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(repo / "benchmarks" / "bench_export.py"), "--rank-writes", "--nodes",
                           "3000", "--classes", "4", "--hidden", "8", "--rounds", "2", "--root", str(tmp_path)],
                          check=True, capture_output=True, text=True)
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["round"] for r in runs] == [0, 1] and all(r["hidden_write_s"] > 0 < r["pred_prob_write_s"]
                                                        for r in runs)
    assert Path(runs[0]["storage"]) == repo / "storage" / "infer.py" and not (tmp_path / "rank-writes").exists()
