"""The external sort's pass 3 on an executor (``stages.executor``): one unit per bucket.

A unit is :func:`sort_bucket` of a :class:`BucketJob` (paths and row bounds only): it reads its bucket's spill file
of keys, sorts and deduplicates them (``external_sort.sorted_bucket``, the code the in-process loop runs), and
writes its sources (the CSR's ``index_dtype``) and its rows' counts (int64, one per row of the bucket: up to the
bucket's rows, which may be many more than its keys where most rows are empty, hence a file and not a return
value) to two files beside its keys. :func:`sort_on` then fills ``indptr`` from the counts and appends the sources
to the output in bucket order: the bytes the in-process loop appends, bucket after bucket.

The files are in the sort's scratch directory, which the unit's worker must reach: beside the work directory on a
local artifact root (a shared file system on a cluster, reached by every worker: ``executor.check_reach``), in
``$TMPDIR`` on an object-store root (the download stage then sorts in this process unless the executor is a local
cluster on this host: ``sort_executor`` below).

Idempotent: a unit writes each file under a temporary name and renames it (the sources last: they say the bucket
is done), and removes its keys only then. A unit rerun after its worker died (Dask reschedules it) either finds
its bucket done and returns, or sorts the same keys again into the same bytes.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.executor import LOCAL, Executor, open_executor, parse_executor
from stages.external_sort import sorted_bucket
from storage.graph import index_dtype
from storage.store import ArtifactStore

COPY_BYTES = 1 << 20   # the append's buffer: with one bucket's counts, the merge's only anonymous memory


@dataclass(frozen=True)
class BucketJob:
    """One unit: bucket ``index``, rows [lo, hi) of an ``num_nodes``-node graph, keys in ``keys`` (``has_keys``:
    the file was written; a bucket without keys has none)."""

    index: int
    keys: str
    lo: int
    hi: int
    num_nodes: int
    has_keys: bool

    @property
    def label(self) -> str:
        """The unit's name in Prefect's task runs."""
        return f"bucket-{self.index}"

    @property
    def sources(self) -> str:
        return f"{self.keys.removesuffix('.keys')}.sources"

    @property
    def counts(self) -> str:
        return f"{self.keys.removesuffix('.keys')}.counts"


def sort_bucket(job: BucketJob) -> dict[str, Any]:
    """The unit: the bucket's sources and counts written (module docstring); returns its edges and wall time."""
    start = time.perf_counter()
    dtype = index_dtype(job.num_nodes)
    if not _done(job):
        if job.has_keys and not os.path.exists(job.keys):
            if not _done(job):   # another attempt of this unit may have finished meanwhile
                raise FileNotFoundError(f"external sort: the keys of bucket {job.index} ({job.keys}) are gone "
                                        f"before it was sorted; rerun the stage")
        else:
            counts, keys = sorted_bucket(job.keys, job.lo, job.hi, job.num_nodes, remove=False)
            _write(job.counts, counts)
            del counts
            _write(job.sources, keys.astype(dtype, copy=False))
            del keys
    if os.path.exists(job.keys):
        os.remove(job.keys)   # after the sources: a rerun still finds what it needs
    return {"bucket": job.index, "edges": os.path.getsize(job.sources) // dtype.itemsize,
            "wall_s": round(time.perf_counter() - start, 4)}


def _done(job: BucketJob) -> bool:
    return os.path.exists(job.sources) and os.path.exists(job.counts)


def _write(path: str, data: np.ndarray) -> None:
    """``data``'s raw bytes to ``path`` through a temporary name of this attempt's own."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    np.ascontiguousarray(data).tofile(tmp)
    os.replace(tmp, path)


def sort_on(executor: Executor, paths: list[str], starts: np.ndarray, n: int, indptr: np.ndarray,
            out_path: str) -> tuple[int, int]:
    """Pass 3 of the buckets whose keys are in ``paths`` as units on ``executor``: ``indptr``'s row counts filled
    in and the sources appended to ``out_path`` in bucket order, each piece removed once appended. Returns the
    edges and the bytes written (the units' sources and counts, and the sources again in ``out_path``)."""
    jobs = [BucketJob(b, path, int(starts[b]), int(starts[b + 1]), n, os.path.exists(path))
            for b, path in enumerate(paths)]
    results = executor.map(sort_bucket, jobs, name="sort-bucket")
    total = written = 0
    with open(out_path, "ab") as out:
        for job, result in zip(jobs, results, strict=True):
            indptr[job.lo + 1:job.hi + 1] = np.fromfile(job.counts, dtype=np.int64)
            written += os.path.getsize(job.counts) + 2 * os.path.getsize(job.sources)
            with open(job.sources, "rb") as piece:
                shutil.copyfileobj(piece, out, COPY_BYTES)
            os.remove(job.counts)
            os.remove(job.sources)
            total += int(result["edges"])
    return total, written


@contextmanager
def sort_executor(text: str, store: ArtifactStore) -> Iterator[tuple[Executor | None, dict[str, Any]]]:
    """Where the download stage's sort runs its buckets (the executor ``text`` names, opened for the block; None:
    in this process) and the summary's words about it. ``local``: None, nothing opened (the path as before
    executors). The sort spills to ``StageWriter.scratch``: on a local root beside the work directory, which every
    worker reaches (``open_executor`` checks the root); on an object-store root this host's ``$TMPDIR``, which the
    workers of a local cluster (``dask[:N]``) share but those of a scheduler elsewhere may not: the buckets are then
    sorted in this process, and the summary says so."""
    spec = parse_executor(text)
    if spec.kind == LOCAL:
        yield None, {}
        return
    if not store.is_local and spec.kind == "address":
        yield None, {"sort_units_local": f"the sort spills to this host's $TMPDIR (the artifact root "
                                         f"{store.root} is an object store), which the workers of {text} may not "
                                         f"reach: its buckets were sorted in this process"}
        return
    # the buckets are counted only after the first pass: open for as many as there are CPUs (dask: one worker each)
    with open_executor(text, units=os.cpu_count() or 1, store=store) as executor:
        yield executor, {"executor_slots": executor.slots}
