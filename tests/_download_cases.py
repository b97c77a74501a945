"""Inputs of the download stage's tests that several test files share: the parameters of the synthetic graphs its
streamed builds take, small ``files`` datasets, and what a build leaves on disk."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.streamed import choose
from stages.memory import MemoryBudget
from storage import InputError
from storage.graph import SPLITS

# The synthetic graphs' parameters of the streamed builds (test_download_stream*, test_executor_sort)
SYNTHETIC = {"dataset": "synthetic", "num_nodes": 20_000, "avg_degree": 10.0, "num_features": 6, "num_classes": 4}
HETERO = {"dataset": "synthetic-hetero", "num_nodes": 20_000, "avg_degree": 10.0, "num_features": 6,
          "num_classes": 4}

# write_dataset's graph: 6 nodes; edges listed once: 0-1, 1-2, 2-0, 3-4, plus a duplicate 1-2 and a self-loop 5-5.
EDGES = np.array([[0, 1, 2, 3, 1, 5],
                  [1, 2, 0, 4, 2, 5]])
X = np.arange(12, dtype=np.float16).reshape(6, 2)
Y = np.array([0, 1, 2, 1, 0, -1])
SPLIT = {"train": np.array([0, 1, 2]), "valid": np.array([3]), "test": np.array([4])}


def write_dataset(d: Path, *, csr: bool = False, meta: dict | None = None) -> Path:
    """The 6-node graph above as a ``files`` dataset in ``d``: an edge list, or (``csr``) an incoming CSR."""
    d.mkdir(parents=True, exist_ok=True)
    if csr:  # incoming CSR of the directed edges 0->1, 1->2, 2->0, 3->4: row v lists sources into v
        np.save(d / "indptr.npy", np.array([0, 1, 2, 3, 3, 4, 4]))
        np.save(d / "indices.npy", np.array([2, 0, 1, 3]))
    else:
        np.save(d / "edge_index.npy", EDGES)
    np.save(d / "x.npy", X)
    np.save(d / "y.npy", Y)
    for name, idx in SPLIT.items():
        np.save(d / f"{name}_idx.npy", idx)
    if meta is not None:
        (d / "meta.json").write_text(json.dumps(meta))
    return d


def messy_edges(rng: np.random.Generator, n: int, e: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Random edges among the first half of the nodes (the rest: empty rows), with self-loops and duplicates."""
    src: np.ndarray = rng.integers(0, n // 2, e).astype(dtype)
    dst: np.ndarray = rng.integers(0, n // 2, e).astype(dtype)
    src[:40] = dst[:40]                       # self-loops
    src[40:80], dst[40:80] = src[80:120], dst[80:120]   # duplicates
    return src, dst


def chunk_files(root: Path) -> dict[str, bytes]:
    """The bytes of each file of the graph a download stage built under ``root``, by path."""
    graph = next(root.glob("download/*/graph.zarr"))
    return {str(p.relative_to(graph)): p.read_bytes() for p in sorted(graph.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    """Temporary files and spill folders a build left under ``root`` (none, after success or failure)."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name or "scratch" in p.name]


def disk_full_after(writes: int, monkeypatch: pytest.MonkeyPatch, prefix: str = "") -> list[str]:
    """Spill appends to files named ``prefix*`` fail with ENOSPC after ``writes`` of them; returns the paths
    appended to (the failing one last)."""
    calls: list[str] = []

    def full(path: str, data: np.ndarray) -> None:
        if os.path.basename(path).startswith(prefix):
            calls.append(path)
            if len(calls) > writes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        with open(path, "ab") as f:
            data.tofile(f)

    monkeypatch.setattr("storage.spill.spill_append", full)
    return calls


def streaming_minimum(params: dict[str, Any]) -> int:
    """The streaming path's minimum, from its one-line refusal of a 1-byte budget."""
    with pytest.raises(InputError) as err:
        choose(download.Params(**params), MemoryBudget(1, "download", "test"))
    return int(re.search(r"raise memory_budget_bytes to (\d+) or more", str(err.value)).group(1))  # type: ignore[union-attr]


def write_files(d: Path, graph: Any, x: np.ndarray) -> Path:
    """``graph`` (orig ids) in the ``files`` layout with features ``x``."""
    d.mkdir(parents=True, exist_ok=True)
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    np.save(d / "edge_index.npy", np.stack([graph.indices, dst]))
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", graph.y)
    for name in SPLITS:
        np.save(d / f"{name}_idx.npy", graph.splits[name])
    return d
