"""``run_kaminpar``: KaMinPar (the ``kaminpar`` package), shared-memory multilevel k-way partitioning.

The bindings (kaminpar 3.7.3) build a graph only from a file: ``kaminpar.Graph`` has no constructor, and
``load_graph`` reads METIS text or ParHIP binary. So the symmetric adjacency is written as a ParHIP binary file
into a temporary directory, loaded, and the file removed at once (KaMinPar copies it into its own arrays).

ParHIP binary, as KaMinPar's reader (kaminpar-io/parhip_parser.cc) reads it, all little-endian:

- header: three uint64, ``version``, ``n``, ``m`` (``m``: adjacency entries, each undirected edge twice);
- ``n + 1`` node offsets, each the BYTE position of the node's first neighbour in the file (not an entry index);
- ``m`` neighbour ids; then ``n`` node weights if present; then ``m`` edge weights if present;
- ``version`` bits, each set when the property is ABSENT: 0 edge weights, 1 node weights, 2 64-bit offsets,
  3 64-bit node ids, 4 64-bit node weights, 5 64-bit edge weights. Narrower fields are widened on load.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

_HEADER_BYTES = 24
_CHUNK = 1 << 24   # adjacency entries converted and written at a time: 64 MiB of uint32, not a copy of all of it
_NO_EDGE_WEIGHTS, _NO_NODE_WEIGHTS, _NARROW_OFFSETS, _NARROW_IDS, _NARROW_NODE_WEIGHTS = 1, 2, 4, 8, 16


def kaminpar_threads(threads: int | None) -> int:
    """The explicit setting, else every CPU this process may run on (a cgroup cpuset or ``taskset`` limits them;
    ``os.cpu_count()``, the whole machine, would oversubscribe the ones we have)."""
    if threads:
        return threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def write_parhip(f: BinaryIO, xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray | None, *,
                 wide: bool) -> None:
    """Write an unweighted-edge ParHIP file. Node ids go as uint32 when they fit (half the bytes of 1 M nodes x
    20 entries: 80 MB, not 160); offsets and node weights as 64-bit when ``wide`` (the bindings' 64-bit build),
    else as 32-bit, which a 32-bit build requires (it exits the process on a wider field)."""
    num_nodes, num_entries = int(xadj.shape[0] - 1), int(adjncy.shape[0])
    id_dtype = np.dtype(np.uint32) if num_nodes <= np.iinfo(np.uint32).max else np.dtype(np.uint64)
    wide_dtype = np.dtype(np.uint64) if wide else np.dtype(np.uint32)
    offsets_start = _HEADER_BYTES + (num_nodes + 1) * wide_dtype.itemsize
    if offsets_start + num_entries * id_dtype.itemsize > np.iinfo(wide_dtype).max or \
            (not wide and id_dtype.itemsize == 8) or \
            (vweights is not None and vweights.size and int(vweights.max()) > np.iinfo(wide_dtype).max):
        raise ValueError(f"a graph of {num_nodes} nodes and {num_entries} adjacency entries needs the 64-bit "
                         f"build of kaminpar")
    version = _NO_EDGE_WEIGHTS | (_NO_NODE_WEIGHTS if vweights is None else 0) | \
        (0 if wide else _NARROW_OFFSETS | _NARROW_NODE_WEIGHTS) | (_NARROW_IDS if id_dtype.itemsize == 4 else 0)
    np.array([version, num_nodes, num_entries], dtype=np.uint64).tofile(f)
    offsets = np.asarray(xadj, dtype=np.uint64) * np.uint64(id_dtype.itemsize)
    offsets += np.uint64(offsets_start)
    offsets.astype(wide_dtype, copy=False).tofile(f)
    del offsets
    for lo in range(0, num_entries, _CHUNK):
        np.asarray(adjncy[lo:lo + _CHUNK]).astype(id_dtype).tofile(f)
    if vweights is not None:
        np.asarray(vweights).astype(wide_dtype).tofile(f)


def run_kaminpar(xadj: np.ndarray, adjncy: np.ndarray, num_parts: int, *, vweights: np.ndarray | None = None,
                 epsilon: float = 0.03, seed: int = 0, threads: int | None = 1,
                 tmp_dir: str | None = None, compress: bool = False) -> np.ndarray:
    """KaMinPar's default preset into ``num_parts`` blocks of at most ``(1 + epsilon)`` x the mean vertex weight;
    ``part_of_orig`` int64 [N].

    ``xadj``/``adjncy``: symmetric, without self-loops or duplicates (KaMinPar assumes it, as METIS does).
    Deterministic for a seed with ONE thread only: on a 4 000-node community graph into 4 parts, seed 7, three
    runs with 1 thread gave the same partition, three with 2 threads three different ones (cut 4.07-4.09 %
    against 4.12 % with 1 thread); the parallel label propagation's order depends on the scheduler. With 1 thread
    the graph is loaded on one thread too (the limit is made first, see below).

    ``tmp_dir``: where the ParHIP file goes (the stage's scratch dir on the artifact root's disk: at 400 M entries
    the file is 1.6 GB, more than a tmpfs ``/tmp`` may hold); None: the system's temporary directory. ``adjncy``
    may be a memory map: it is written ``_CHUNK`` entries at a time.

    ``compress``: KaMinPar keeps its input graph compressed (``load_graph(..., compress=True)``): the same
    partition (np.array_equal at 1 M / 29 M and 3 M / 87 M entries, tests/test_partition_memory.py), ~30 % less
    peak memory, ~1.8x the time (``stages.partition.footprint``), so a runtime choice of the memory plan.
    """
    import kaminpar

    kaminpar.reseed(int(seed))
    # the solver first: it holds TBB's limit of ``threads`` workers. Made after load_graph (parallel loops without
    # a limit), a worker woken for the load could still join compute_partition with threads=1 and change the
    # partition for the same seed: 1 call in ~1 000 on 2 cores (3/3 000, 1/1 000; 0/4 000 made first), a CI
    # failure of tests/test_partition_stream.py's in-memory vs chunked comparison
    solver = kaminpar.KaMinPar(kaminpar_threads(threads), kaminpar.default_context())
    with tempfile.TemporaryDirectory(prefix="gnnpipe-kaminpar-", dir=tmp_dir) as tmp:
        path = Path(tmp) / "graph.parhip"
        with path.open("wb") as f:
            # not in the package's stub; absent, the 32-bit fields every build reads
            write_parhip(f, xadj, adjncy, vweights, wide=bool(getattr(kaminpar, "__64bit__", False)))
        graph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP, compress=bool(compress))
        path.unlink()
    # a Python list; its block ids (< 257) are CPython's shared small ints, so 8 bytes a node (pointers only)
    part = solver.compute_partition(graph, int(num_parts), float(epsilon))
    return np.asarray(part, dtype=np.int64)
