"""The partition stage's anonymous memory, estimated from N, E and the method before any work (``stages.memory``):
which path runs (the whole graph in memory, or memory maps in the scratch dir and chunked passes), whether
KaMinPar gets its graph compressed, and the one ``error:`` line when even the streamed path cannot fit
``memory_budget_bytes``.

KaMinPar's estimate is the peak of the stage's phases, not their sum, because each phase frees what the next does
not need (read off stage._partition and assign.assign_parts):

(s) streamed, a directed or typed graph only: the external sort builds the symmetric adjacency (below);
(a) KaMinPar runs: the stage holds the splits, the train mask and the vertex weights (``HELD_NODE_BYTES``), and
    KaMinPar its graph and its coarse levels. The adjacency check and the ParHIP write before it (< 24 a node and
    one chunk) are below phase (b);
(b) the balance repair and the report: the O(N) repair arrays (``REPAIR_NODE_BYTES``, with the vertex weights),
    ``conn`` and its copy, the splits, and the chunk temporaries;
(c) relabel and the part writes: the book's maps, the assignment while relabel runs, and the chunk temporaries:
    below (b) for any P (``BOOK_NODE_BYTES`` < ``REPAIR_NODE_BYTES``), kept in the max so that stays checked.

METIS keeps its estimate as a sum (its own memory on top of all the O(N) arrays), as measured before; streamed, a
directed or typed graph's phase (s) runs before it and holds far less (kept in a max, so that stays checked).

The figures (bytes; this box, numpy 2, pymetis 2025.2.2, kaminpar 3.7.3's 64-bit build):

- METIS: ~130 per entry of its input (at most ``adjacency.default_budget(N)`` entries): benchmarks/RESULTS.md
  "METIS input budget" peaks less the 0.9 GB graph, 2.3 / 4.4 / 8.4 GB at 2^24 / 2^25 / 2^26 entries (137, 131,
  125 a entry), and "[2/5] KaMinPar beside METIS": 1.97 GiB over the start for 16.8 M entries at 1 M nodes (126).
- KaMinPar: ``KAMINPAR_BYTES_PER_NODE`` a node + ``kaminpar_entry_bytes`` an adjacency entry, compressed
  (``load_graph(..., compress=True)``) or not: peak RssAnon of a child process that only loads the ParHIP file and
  partitions it (see the constants). The coarse levels are not compressed, so compression saves ~45 % of the peak
  (1.29 against 2.19 GB at 7 M nodes), not the 3.3x of the input graph alone. The output is the same array either
  way (np.array_equal at 1 M, 3 M and 7 M nodes; tests/test_partition_memory.py), so compression is a runtime
  choice outside the key; it is slower (113 against 75 s at 7 M / 203 M entries), hence only when the
  uncompressed estimate does not fit.
- So papers100M's shape at 14 M nodes (406 M entries) fits a 4 GiB budget compressed: 2.85 GB measured in the
  KaMinPar phase (estimate 3.4 GB with the stage's own arrays and the margin).
- The O(N) arrays while the balance repair runs: part, train mask, degrees and vertex weights, the repair's
  weights [N, 3] and best parts (~90 a node), ``conn`` [N, P] int32 with its copy in the refinement (8 a node and
  part), and the splits (8 a node: train, valid and test as int64 are at most N ids); the book's two maps (16).
- Row-chunk temporaries: ``csr_ops.CHUNK_EDGES`` entries at a time, ~40 a chunk entry (row ids, gathered parts,
  keys, a masked copy: five int64 arrays of the chunk at most).
- Symmetrising a directed or typed graph, in memory (``adjacency._symmetrise``): both directions' int64 keys (16 a
  graph entry) and their concatenation (16), sorted in place, then the deduplicated copy (16, with a 2-byte mask)
  and the result's row ids (16): 45 a graph entry over the start measured with the row-chunk temporaries (432 MiB
  for a directed 1 M-node graph of 10 M entries), budgeted at 64 a graph entry as before and counted in every
  phase (its result, up to 2E entries, is what the partitioner and repair walk).
- Streamed, the external sort instead (``adjacency.external_symmetric``, ``stages.external_sort``): its phase (s)
  holds the splits, the train mask, a typed graph's node_indptr copy and node types, and the sort's row counts
  (``SORT_NODE_BYTES`` a node), plus the sort's temporaries: buckets of keys at 32 B a key and slices of edges at
  64 B an edge, sized to a byte share the stage passes (``MemoryPlan.sort_bytes``). That share is what the peak of
  the other phases leaves (``sort_share``), so the sort fills the estimate and never raises it, with the sort's
  floor (one smallest bucket and slice, ``external_sort.MIN_BYTES``) as its least. Its result's ``adjncy`` is a
  memory map in the scratch dir (int32 below 2^31 nodes: page cache, not anonymous memory); every later phase
  holds only its int64 ``xadj`` (``XADJ_NODE_BYTES`` a node) where the in-memory path holds 64 B a graph entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stages.external_sort import MIN_BYTES as SORT_MIN_BYTES
from stages.external_sort import NODE_BYTES as SORT_COUNT_NODE_BYTES
from stages.memory import MemoryBudget, gib
from stages.partition.adjacency import default_budget
from stages.partition.csr_ops import CHUNK_EDGES
from storage.errors import InputError

METIS_BYTES_PER_ENTRY = 130
# KaMinPar's peak RssAnon in a child process that only loads the ParHIP file (with vertex weights) and partitions it
# into 2 parts with 1 thread, sampled from outside every 20 ms, on generate_synthetic(N, 29) (the session's
# measurements, benchmarks/RESULTS.md "[2/5] KaMinPar's memory"): compressed 425 MB at 3 M nodes / 87 M entries,
# 1.29 GB at 7 M / 203 M, 2.85 GB at 14 M / 406 M; uncompressed 864 MB and 2.19 GB at the first two. With 48 B a
# node for its node arrays and 16 for the partition it returns (a Python list, then an int64 array), that is per
# entry 3.2 / 4.7 / 5.4 compressed and 8.3 / 9.1 uncompressed: it grows with N (random relabelled ids compress
# worse, the coarse levels, never compressed, grow with them), ~0.8-1.5 per doubling of N. Hence a per-entry law
# anchored at the largest measurement, ~1 more per doubling, and a 10 % margin (``kaminpar_entry_bytes``).
KAMINPAR_BYTES_PER_NODE = 48 + 16
KAMINPAR_ENTRY_LAW = {True: (14_000_000, 5.4), False: (7_000_000, 9.1)}   # compress -> (N measured, B an entry)
KAMINPAR_MARGIN = 1.1
NODE_BYTES = 106               # METIS's sum: ~90 during the repair + the book's 16
REPAIR_NODE_BYTES = 90         # phase (b), with the vertex weights and the assignment
SPLIT_NODE_BYTES = 8           # train, valid and test ids (int64), read for the train mask, held to the end
HELD_NODE_BYTES = SPLIT_NODE_BYTES + 1 + 8   # phase (a): the splits, the train mask and the vertex weights
BOOK_NODE_BYTES = 16 + 8 + 2 + 8 + 8 + 1     # phase (c): book maps, part, its int16 key, arange temp, train mask
NODE_PART_BYTES = 8            # conn [N, P] int32 and its copy
CHUNK_BYTES_PER_ENTRY = 40
SYMMETRISE_BYTES_PER_ENTRY = 64
XADJ_NODE_BYTES = 8            # streamed: the symmetric adjacency's int64 xadj, held to the end (adjncy is mapped)
# streamed, while the external sort runs: the splits, the train mask, a typed graph's contiguous node_indptr and its
# int8 node types (8 + 1 + 8 + 1), and the sort's row counts (external_sort.NODE_BYTES)
SORT_NODE_BYTES = SPLIT_NODE_BYTES + 1 + 8 + 1 + SORT_COUNT_NODE_BYTES
# The in-memory path besides the minimum: the graph as read, and one part's CSR built whole (its int64 gids, the
# gathered orig ids and the on-disk int32 copy: ~20 a part entry)
PART_BYTES_PER_ENTRY = 20


@dataclass(frozen=True)
class MemoryPlan:
    """The estimates, and whether the stage streams (memory maps, chunked part writes) or reads the graph whole."""

    minimum: int       # the streamed path: the peak phase of O(N) arrays, chunk temporaries, the partitioner
    in_memory: int     # the in-memory path: its phases (a directed graph symmetrised in memory), the graph and a
    #                    whole part's CSR
    streamed: bool
    what: str          # the minimum in words, for the error line and the summary
    compress: bool = False   # KaMinPar loads its graph compressed (the same partition, less memory)
    phases: tuple[tuple[str, int], ...] = ()   # KaMinPar: each phase's estimate, for the summary
    sort_bytes: int = 0      # streamed, directed or typed: the external sort's temporaries (0: no external sort)


def kaminpar_entry_bytes(num_nodes: int, compress: bool) -> float:
    """KaMinPar's bytes per adjacency entry at ``num_nodes`` (the measured law above, with its margin)."""
    anchor_nodes, anchor_bytes = KAMINPAR_ENTRY_LAW[compress]
    return KAMINPAR_MARGIN * max(3.0, anchor_bytes + math.log2(max(num_nodes, 1) / anchor_nodes))


def kaminpar_bytes(num_nodes: int, adjacency: int, compress: bool) -> int:
    """KaMinPar's own peak (its graph and coarse levels) for ``adjacency`` symmetric entries."""
    return int(kaminpar_entry_bytes(num_nodes, compress) * adjacency) + KAMINPAR_BYTES_PER_NODE * num_nodes


def kaminpar_phases(num_nodes: int, adjacency: int, num_parts: int, chunk: int, common: int,
                    compress: bool) -> tuple[tuple[str, int], ...]:
    """(phase, estimate) of the stage with KaMinPar (module docstring); ``common``: what every phase holds (link
    splits, a symmetrised adjacency)."""
    return (("kaminpar", common + HELD_NODE_BYTES * num_nodes + kaminpar_bytes(num_nodes, adjacency, compress)),
            ("repair", common + (REPAIR_NODE_BYTES + SPLIT_NODE_BYTES + NODE_PART_BYTES * num_parts) * num_nodes
             + chunk),
            ("relabel", common + (BOOK_NODE_BYTES + SPLIT_NODE_BYTES) * num_nodes + chunk))


def plan(budget: MemoryBudget, *, num_nodes: int, num_entries: int, num_parts: int, method: str,
         symmetrise: bool, graph_bytes: int, link_bytes: int = 0, edge_attr_bytes: int = 0) -> MemoryPlan:
    """The stage's memory plan, or the one-line InputError when it cannot fit ``budget`` (before any work).

    ``num_entries``: CSR entries; ``symmetrise``: the graph is directed or typed (no stored symmetric
    adjacency); ``graph_bytes``: ``indptr`` + ``indices`` as stored; ``link_bytes``: link prediction's splits and
    fixed negatives (held in memory on both paths, with their gid copies: counted three times);
    ``edge_attr_bytes``: ``edge_attr``, which only the in-memory path holds whole.

    Path and compression, cheapest first: in memory, in memory with KaMinPar compressed, streamed, streamed and
    compressed (compression is ~1.8x KaMinPar's time; streaming costs one spill of the graph)."""
    partitioned = num_parts > 1 and method != "random"
    sort = partitioned and symmetrise   # no stored symmetric adjacency: the stage builds one
    adjacency = 2 * num_entries if symmetrise else num_entries   # upper bound: each direction once
    chunk = min(CHUNK_EDGES, num_entries) * CHUNK_BYTES_PER_ENTRY
    extra = graph_bytes + 2 * edge_attr_bytes + PART_BYTES_PER_ENTRY * num_entries // max(1, num_parts)
    # what every phase holds, in memory (False) and streamed (True); the external sort's phase holds sort_held
    link = 3 * link_bytes
    common = {False: link + (SYMMETRISE_BYTES_PER_ENTRY * num_entries if sort else 0),
              True: link + (XADJ_NODE_BYTES * num_nodes if sort else 0)}
    sort_held = link + SORT_NODE_BYTES * num_nodes if sort else 0
    parts = ["the link prediction splits"] if link_bytes else []
    if sort:
        parts.append(f"the symmetric adjacency's xadj ({XADJ_NODE_BYTES} B a node; {SORT_NODE_BYTES} B a node and "
                     f"at least {gib(SORT_MIN_BYTES)} while the external sort builds it)")
    if partitioned and method == "kaminpar":
        return _kaminpar_plan(budget, num_nodes, adjacency, num_parts, chunk, common, sort_held, extra, parts)
    parts.insert(0, f"the O(N) arrays ({NODE_BYTES + NODE_PART_BYTES * num_parts} B a node)")
    nodes = num_nodes * (NODE_BYTES + NODE_PART_BYTES * num_parts) + chunk
    metis = METIS_BYTES_PER_ENTRY * min(adjacency, default_budget(num_nodes)) if partitioned else 0
    # METIS: its memory on top of every O(N) array, as measured; the sort runs before and holds less
    minimum = max(nodes + common[True] + metis, sort_held + SORT_MIN_BYTES if sort else 0)
    in_memory = nodes + common[False] + metis + extra
    need = min(minimum, in_memory)   # in memory only on a graph of hardly any edges (below the sort's floor)
    if partitioned and need > budget.bytes:
        raise InputError(f"method=metis needs an estimated {gib(need)} of memory here (METIS "
                         f"{gib(metis)}: {METIS_BYTES_PER_ENTRY} B per input entry, measured), more than "
                         f"memory_budget_bytes={budget.bytes} ({budget.describe()}); use method=kaminpar or "
                         f"raise memory_budget_bytes to {need} or more")
    if partitioned:
        parts.append("METIS")
    what = ", ".join(parts) + f" and {gib(chunk)} of chunk temporaries"
    budget.require(need, what)
    streamed = not budget.fits(in_memory)
    return MemoryPlan(minimum=minimum, in_memory=in_memory, streamed=streamed, what=what,
                      sort_bytes=sort_share(minimum, sort_held) if streamed and sort else 0)


def sort_share(minimum: int, sort_held: int) -> int:
    """The external sort's bytes of temporaries: what the peak of the other phases leaves it (so it never raises
    the estimate), at least its floor."""
    return max(SORT_MIN_BYTES, minimum - sort_held)


def _kaminpar_plan(budget: MemoryBudget, num_nodes: int, adjacency: int, num_parts: int, chunk: int,
                   common: dict[bool, int], sort_held: int, extra: int, parts: list[str]) -> MemoryPlan:
    """KaMinPar's plan: the peak phase (module docstring), the first of the four choices that fits, cheapest first:
    streaming the CSR costs a spill copy (seconds), compression ~1.5x KaMinPar's time (113 against 75 s at 7 M
    nodes), so in memory, streamed, in memory compressed, streamed compressed."""
    def phases(streamed: bool, compress: bool) -> tuple[tuple[str, int], ...]:
        each = kaminpar_phases(num_nodes, adjacency, num_parts, chunk, common[streamed], compress)
        if not (streamed and sort_held):
            return each
        others = max(e for _, e in each)
        return (("symmetrise", sort_held + sort_share(others, sort_held)),) + each

    # (estimate of the path, streamed, its phases, compress, the streamed minimum, the in-memory estimate)
    choices = []
    for compress in (False, True):
        minimum = max(e for _, e in phases(True, compress))
        in_memory = max(e for _, e in phases(False, compress)) + extra
        choices += [(in_memory, False, phases(False, compress), compress, minimum, in_memory),
                    (minimum, True, phases(True, compress), compress, minimum, in_memory)]
    # the first that fits, else the last (the smallest minimum), which the require below refuses
    _, streamed, chosen, compress, minimum, in_memory = next((c for c in choices if budget.fits(c[0])), choices[-1])
    # the cheapest choice: the streamed compressed one, but in memory on a graph of hardly any edges (below the
    # external sort's floor)
    need = min(c[0] for c in choices)
    packed = phases(True, True)
    what = ", ".join(parts + [f"the O(N) arrays ({REPAIR_NODE_BYTES + SPLIT_NODE_BYTES + NODE_PART_BYTES * num_parts}"
                              f" B a node in the balance repair)",
                              f"KaMinPar's compressed graph and coarse levels "
                              f"({kaminpar_entry_bytes(num_nodes, True):.1f} B an entry + "
                              f"{KAMINPAR_BYTES_PER_NODE} B a "
                              f"node, the peak phase: {', '.join(f'{n} {gib(e)}' for n, e in packed)})"])
    what += f" and {gib(chunk)} of chunk temporaries"
    budget.require(need, what)
    return MemoryPlan(minimum=minimum, in_memory=in_memory, streamed=streamed, what=what, compress=compress,
                      phases=chosen, sort_bytes=sort_share(minimum, sort_held) if streamed and sort_held else 0)


# A unit of the part writes on an executor (``stages.partition.units``), from relabel's and the streamed writer's
# arrays: the book's two maps read back as int64 (16 B a node) and the node splits that ``streamed.mapped_graph``
# reads (``SPLIT_NODE_BYTES``); per part row (node and edge type) while ``relabel.part_csr_chunks`` counts the
# part's degrees, its int64 indptr, the orig rows, the two gathered indptr values and their difference (40 B);
# link prediction's splits as for the stage (three times); per graph entry of a row chunk the mask that picks the
# part's entries (1 B); per part entry of a chunk the chunk temporaries (``CHUNK_BYTES_PER_ENTRY``), or with edge
# attributes the chunk's gids held while ``relabel.rows_edge_orig_pos`` runs (orig positions, their rows, the
# gids, the lexsort and its gather: 64 B) and an attribute row twice (gathered, then in the writer's pending
# chunk); and the writer's pending Zarr chunk of indices. Measured (random, 3 parts, 2 units): 200 MiB over the
# start against 338 MiB estimated at 1 M nodes / 10 M entries, 251 MiB against 826 MiB with link splits and 4
# edge features (8.5 M entries): conservative, mostly by the part bound below (twice a balanced part) and the
# link splits counted three times as for the stage.
UNIT_NODE_BYTES = 16 + SPLIT_NODE_BYTES
PART_ROW_BYTES = 40
MASK_ENTRY_BYTES = 1
ATTR_ENTRY_BYTES = 64
# Part sizes are known only once the partitioner has run, and the share is checked before: a part's nodes and
# entries are bounded by twice the balanced share (the balance repair keeps nodes, train nodes and in-edges within
# 3 %, balance.DEFAULT_TOLERANCE; an unrepaired METIS or KaMinPar part within a few %)
PART_SIZE_BOUND = 2
WRITER_CHUNK_BYTES = 64 << 20   # storage.partition_stream: at most one Zarr chunk of indices pending
UNIT_HOLDS = "the partition book, the splits, one part's rows and chunk temporaries"   # in the error line


def unit_minimum(*, num_nodes: int, num_entries: int, num_parts: int, num_edge_types: int, link_bytes: int = 0,
                 edge_attr_bytes: int = 0) -> int:
    """One part-writing unit's estimate (above): what each unit's share of ``memory_budget_bytes`` must hold
    (``MemoryBudget.share``)."""
    parts = max(1, num_parts)
    rows = min(num_nodes, PART_SIZE_BOUND * -(-num_nodes // parts)) * num_edge_types
    part_entries = min(num_entries, PART_SIZE_BOUND * -(-num_entries // parts))
    chunk = min(CHUNK_EDGES, part_entries)
    attr_row = edge_attr_bytes // max(1, num_entries)
    entry = ATTR_ENTRY_BYTES + 2 * attr_row if edge_attr_bytes else CHUNK_BYTES_PER_ENTRY
    return (UNIT_NODE_BYTES * num_nodes + PART_ROW_BYTES * rows + 3 * link_bytes
            + MASK_ENTRY_BYTES * min(CHUNK_EDGES, num_entries) + entry * chunk
            + min(WRITER_CHUNK_BYTES, 4 * part_entries))
