"""The partition stage's anonymous memory, estimated from N, E and the method before any work (``stages.memory``):
which path runs (the whole graph in memory, or memory maps in the scratch dir and chunked passes), and the one
``error:`` line when even the streamed path cannot fit ``memory_budget_bytes``.

The figures (bytes; this box, numpy 2, pymetis 2025.2.2, kaminpar 3.7.3's 64-bit build):

- METIS: ~130 per entry of its input (at most ``adjacency.default_budget(N)`` entries): benchmarks/RESULTS.md
  "METIS input budget" peaks less the 0.9 GB graph, 2.3 / 4.4 / 8.4 GB at 2^24 / 2^25 / 2^26 entries (137, 131,
  125 a entry), and "[2/5] KaMinPar beside METIS": 1.97 GiB over the start for 16.8 M entries at 1 M nodes (126).
- KaMinPar: 10 per adjacency entry + 48 per node (its graph, the 64-bit build, and its coarse levels), measured
  from outside the process (peak RssAnon over the start of ``run_kaminpar``): 85 MB at 1 M nodes / 4 M entries,
  235 MB at 1 M / 20 M, 172 MB at 250 k / 20 M; the 32-bit build would need about half.
- The O(N) arrays while the balance repair runs (the stage's peak of them): part, train mask, degrees and vertex
  weights, the repair's weights [N, 3] and best parts (~90 a node), and ``conn`` [N, P] int32 with its copy in
  the refinement (8 a node and part); the book's two maps (16) after that.
- Row-chunk temporaries: ``csr_ops.CHUNK_EDGES`` entries at a time, ~40 a chunk entry (row ids, gathered parts,
  keys, a masked copy: five int64 arrays of the chunk at most).
- Symmetrising a directed or typed graph (``adjacency._symmetrise``) is not streamed: both directions' int64 keys
  (16 a graph entry), their concatenation and ``np.unique``'s sorted copy (32), the result (16): 64 a graph entry,
  held in memory on either path (its output, up to 2E entries, is what the partitioner and repair walk).
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.memory import MemoryBudget, gib
from stages.partition.adjacency import default_budget
from stages.partition.csr_ops import CHUNK_EDGES
from storage.errors import InputError

METIS_BYTES_PER_ENTRY = 130
KAMINPAR_BYTES_PER_ENTRY = 10
KAMINPAR_BYTES_PER_NODE = 48
NODE_BYTES = 106               # O(N) arrays: ~90 during the repair + the book's 16
NODE_PART_BYTES = 8            # conn [N, P] int32 and its copy
CHUNK_BYTES_PER_ENTRY = 40
SYMMETRISE_BYTES_PER_ENTRY = 64
# The in-memory path besides the minimum: the graph as read, and one part's CSR built whole (its int64 gids, the
# gathered orig ids and the on-disk int32 copy: ~20 a part entry)
PART_BYTES_PER_ENTRY = 20


@dataclass(frozen=True)
class MemoryPlan:
    """The estimates, and whether the stage streams (memory maps, chunked part writes) or reads the graph whole."""

    minimum: int       # the streamed path: O(N) arrays, chunk temporaries, the partitioner, link splits
    in_memory: int     # today's path: the minimum, the graph and a whole part's CSR
    streamed: bool
    what: str          # the minimum in words, for the error line and the summary


def plan(budget: MemoryBudget, *, num_nodes: int, num_entries: int, num_parts: int, method: str,
         symmetrise: bool, graph_bytes: int, link_bytes: int = 0, edge_attr_bytes: int = 0) -> MemoryPlan:
    """The stage's memory plan, or the one-line InputError when it cannot fit ``budget`` (before any work).

    ``num_entries``: CSR entries; ``symmetrise``: the graph is directed or typed (no stored symmetric
    adjacency); ``graph_bytes``: ``indptr`` + ``indices`` as stored; ``link_bytes``: link prediction's splits and
    fixed negatives (held in memory on both paths, with their gid copies: counted three times);
    ``edge_attr_bytes``: ``edge_attr``, which only the in-memory path holds whole."""
    partitioned = num_parts > 1 and method != "random"
    adjacency = 2 * num_entries if symmetrise else num_entries   # upper bound: each direction once
    parts = [f"the O(N) arrays ({NODE_BYTES + NODE_PART_BYTES * num_parts} B a node)"]
    minimum = num_nodes * (NODE_BYTES + NODE_PART_BYTES * num_parts)
    chunk = min(CHUNK_EDGES, num_entries) * CHUNK_BYTES_PER_ENTRY
    minimum += chunk
    if link_bytes:
        minimum += 3 * link_bytes
        parts.append("the link prediction splits")
    if partitioned and symmetrise:
        minimum += SYMMETRISE_BYTES_PER_ENTRY * num_entries
        parts.append(f"symmetrising the directed/typed graph in memory ({SYMMETRISE_BYTES_PER_ENTRY} B an entry)")
    if partitioned and method == "metis":
        metis = METIS_BYTES_PER_ENTRY * min(adjacency, default_budget(num_nodes))
        if minimum + metis > budget.bytes:
            raise InputError(f"method=metis needs an estimated {gib(minimum + metis)} of memory here (METIS "
                             f"{gib(metis)}: {METIS_BYTES_PER_ENTRY} B per input entry, measured), more than "
                             f"memory_budget_bytes={budget.bytes} ({budget.describe()}); use method=kaminpar or "
                             f"raise memory_budget_bytes to {minimum + metis} or more")
        minimum += metis
        parts.append("METIS")
    elif partitioned:
        minimum += KAMINPAR_BYTES_PER_ENTRY * adjacency + KAMINPAR_BYTES_PER_NODE * num_nodes
        parts.append(f"KaMinPar's graph ({KAMINPAR_BYTES_PER_ENTRY} B an entry + {KAMINPAR_BYTES_PER_NODE} B a "
                     f"node)")
    what = ", ".join(parts) + f" and {gib(chunk)} of chunk temporaries"
    budget.require(minimum, what)
    in_memory = minimum + graph_bytes + 2 * edge_attr_bytes + \
        PART_BYTES_PER_ENTRY * num_entries // max(1, num_parts)
    return MemoryPlan(minimum=minimum, in_memory=in_memory, streamed=not budget.fits(in_memory), what=what)
