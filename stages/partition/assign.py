"""``assign_parts``: which part each node (orig id) goes to, by METIS, KaMinPar or a balanced random split.

METIS pipeline (every step vectorised numpy; METIS gets int64 arrays, pymetis's zero-copy ``idx_t``):

1. the symmetric, self-loop-free adjacency (``adjacency.symmetric_adjacency``; with ``sort_budget``, a directed or
   typed graph's by the external sort, ``adjacency.external_symmetric``: the same arrays, memory-mapped);
2. for big graphs a sparsified copy of it (``adjacency.sparsify``), because METIS with 64-bit idx_t needs ~15x its
   input in memory;
3. METIS k-way with ONE vertex weight, ``avg_degree + in_degree`` when ``balance_edges`` (nodes and incoming
   edges then count about equally), else 1 per node. A second constraint for train nodes would be the natural
   way, but pymetis 2025.2.2 silently ignores multi-constraint weights (measured), hence step 4;
4. ``balance.rebalance`` on the whole adjacency: node, train-node and edge counts within ``tolerance``, then a
   cut refinement that keeps them there.

KaMinPar (``method="kaminpar"``, ``kaminpar_runner.run_kaminpar``) takes METIS's place in step 3 with the same
single vertex weight, and step 2 is skipped: sparsifying is there for METIS's memory, and KaMinPar needs far less
(benchmarks/RESULTS.md "[2/5] KaMinPar beside METIS"). Step 4 is the same repair, so both meet the same tolerances.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import numpy as np

from stages.choices import PARTITION_METHODS
from stages.partition.adjacency import external_symmetric, sparsify, symmetric_adjacency
from stages.partition.balance import DEFAULT_TOLERANCE, rebalance, type_groups
from stages.partition.csr_ops import degrees
from stages.partition.kaminpar_runner import run_kaminpar
from storage.progress import progress as tqdm


def check_inputs(indptr: np.ndarray, indices: np.ndarray, train_mask: np.ndarray, num_parts: int,
                 method: str) -> int:
    """Check the arguments; returns the number of nodes.

    The partition stage's Params and ``run`` reject bad user values before they get here, and the arrays come from
    ``graph.zarr``: a failure is a broken invariant (ValueError), not a user error.
    """
    num_nodes = int(np.asarray(indptr).shape[0] - 1)
    if method not in PARTITION_METHODS:
        raise ValueError(f"unknown partition method '{method}'; choose one of: {', '.join(PARTITION_METHODS)}")
    if not 1 <= num_parts <= max(num_nodes, 1):
        raise ValueError(f"num_partitions={num_parts} is out of range for a graph of {num_nodes} nodes; "
                         f"choose 1..{num_nodes}")
    if np.asarray(train_mask).shape != (num_nodes,):
        raise ValueError(f"train mask has shape {np.asarray(train_mask).shape}, expected ({num_nodes},); "
                         f"rerun the download stage")
    if int(np.asarray(indptr)[-1]) != int(np.asarray(indices).shape[0]):
        raise ValueError(f"CSR indptr ends at {int(np.asarray(indptr)[-1])} but there are "
                         f"{int(np.asarray(indices).shape[0])} indices; rerun the download stage")
    return num_nodes


def random_parts(num_nodes: int, num_parts: int, seed: int, train_mask: np.ndarray | None = None,
                 node_type: np.ndarray | None = None) -> np.ndarray:
    """A seeded, exactly node-balanced random split (part sizes differ by at most one, per node type too).

    The nodes are dealt round-robin in a random order, type after type; with ``train_mask`` a type's train nodes
    are dealt first, so train counts are exactly balanced too (instead of only in expectation) at no cost to node
    balance.
    """
    rng = np.random.default_rng(seed)
    runs = []
    for in_type in type_groups(node_type, num_nodes):
        if train_mask is None:
            runs.append(rng.permutation(np.flatnonzero(in_type)))
        else:
            runs += [rng.permutation(np.flatnonzero(train_mask & in_type)),
                     rng.permutation(np.flatnonzero(~train_mask & in_type))]
    order_orig = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
    part_of_orig = np.empty(num_nodes, dtype=np.int64)
    part_of_orig[order_orig] = np.arange(num_nodes, dtype=np.int64) % num_parts
    return part_of_orig


def metis_vertex_weights(indptr: np.ndarray, balance_edges: bool) -> np.ndarray | None:
    """One weight per node: ``a + in_degree`` with ``a`` the average degree, so the node term and the edge term
    have the same total; ``None`` (unit weights) without ``balance_edges``."""
    if not balance_edges:
        return None
    num_nodes = int(indptr.shape[0] - 1)
    avg = max(1, round(int(indptr[-1]) / max(num_nodes, 1)))
    return degrees(indptr) + avg


def run_metis(xadj: np.ndarray, adjncy: np.ndarray, num_parts: int, *, vweights: np.ndarray | None = None,
              eweights: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """pymetis k-way; arrays are passed as contiguous ``zero_copy_dtype`` arrays so pymetis does not copy them
    into Python lists (it warns with ``warn_on_copies`` when it has to). An int32 or memory-mapped ``adjncy`` (the
    streamed path's, when ``sparsify`` left it whole) becomes one int64 copy here: at most
    ``adjacency.default_budget(N)`` entries at 8 B, inside METIS's 130 B an input entry (``footprint``)."""
    import pymetis

    idx = np.dtype(pymetis.zero_copy_dtype()) if hasattr(pymetis, "zero_copy_dtype") else np.dtype(np.int64)

    def as_idx(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=idx)

    def as_opt_idx(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else as_idx(a)

    # k-way, not pymetis's default recursive bisection for <= 8 parts: one code path for every P, faster for P > 2
    kwargs: dict[str, Any] = {"vweights": as_opt_idx(vweights), "eweights": as_opt_idx(eweights), "recursive": False}
    if "warn_on_copies" in inspect.signature(pymetis.part_graph).parameters:
        kwargs["warn_on_copies"] = True  # a copy at products scale is GBs of Python ints: make it visible
    try:
        kwargs["options"] = pymetis.Options(seed=int(seed))
    except (AttributeError, TypeError):  # older pymetis: no seed option; METIS's default seed is fixed anyway
        pass
    if hasattr(pymetis, "CSRAdjacency"):
        result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(as_idx(xadj), as_idx(adjncy)), **kwargs)
    else:
        result = pymetis.part_graph(num_parts, xadj=as_idx(xadj), adjncy=as_idx(adjncy), **kwargs)
    return np.asarray(result.vertex_part, dtype=np.int64)


def _adjacency(indptr: np.ndarray, indices: np.ndarray, directed: bool, sort_budget: int | None,
               scratch_dir: str | None, stats: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Step 1: the symmetric adjacency, a directed graph's by the external sort when given ``sort_budget``."""
    if not directed or sort_budget is None:
        return symmetric_adjacency(indptr, indices, directed=directed)
    if scratch_dir is None:
        raise ValueError("assign_parts: sort_budget needs scratch_dir, where the external sort spills")
    csr = external_symmetric(indptr, indices, budget_bytes=sort_budget, scratch=scratch_dir)
    stats["adjacency_sort_buckets"] = csr.buckets
    return csr.indptr, csr.indices


def assign_parts(indptr: np.ndarray, indices: np.ndarray, train_mask: np.ndarray, num_parts: int, *,
                 method: str = "metis", seed: int = 0, directed: bool = False, balance_train: bool = True,
                 balance_edges: bool = True, progress: bool = False, tolerance: float = DEFAULT_TOLERANCE,
                 metis_edge_budget: int | None = None, stats: dict[str, Any] | None = None,
                 node_type: np.ndarray | None = None, threads: int | None = 1,
                 scratch_dir: str | None = None, compress: bool = False,
                 sort_budget: int | None = None) -> np.ndarray:
    """``part_of_orig`` int64 [N] in [0, num_parts): the part each orig node goes to.

    ``indptr``/``indices``: the incoming-edge CSR in orig ids (``storage.graph``). ``tolerance``: the max/mean
    node, train-node and edge counts the METIS result is repaired to. ``metis_edge_budget``: CSR entries above
    which METIS gets a sparsified graph (default ``adjacency.default_budget``). ``stats``, if given, receives
    timings and move counts (for reports and benchmarks). ``node_type`` (typed graphs, int [N]): nodes and train
    nodes are balanced per type (``balance.rebalance``). ``threads``: KaMinPar's (None: every usable CPU; only 1
    is reproducible, ``kaminpar_runner.run_kaminpar``). ``scratch_dir``: KaMinPar's input file's directory.
    ``compress``: KaMinPar's graph compressed (the same partition in less memory, ``run_kaminpar``).
    ``sort_budget`` (with ``scratch_dir``; the stage's streamed path): a directed graph is symmetrised by the
    external sort with this many bytes of temporaries, not in memory (the same adjacency, so the same partition;
    ``stats["adjacency_sort_buckets"]`` says it ran).

    ``indptr``/``indices`` may be memory maps (the stage's streamed path): every pass over the edges goes in row
    chunks, so besides the partitioner's own memory the extra is O(N) (``stages.partition.footprint``).
    """
    num_nodes = check_inputs(indptr, indices, train_mask, num_parts, method)
    train_mask = np.asarray(train_mask, dtype=bool)
    stats = {} if stats is None else stats
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    if method == "random":
        return random_parts(num_nodes, num_parts, seed, train_mask if balance_train else None, node_type)

    solver = "KaMinPar" if method == "kaminpar" else "METIS"
    bar = tqdm(total=4, desc="partition: adjacency", disable=not progress, leave=False)
    t0 = time.perf_counter()
    xadj, adjncy = _adjacency(indptr, indices, directed, sort_budget, scratch_dir, stats)
    vweights = metis_vertex_weights(indptr, balance_edges)
    bar.update()
    t1 = time.perf_counter()
    if method == "kaminpar":   # the whole adjacency: no sparsifying (see the module docstring)
        bar.update()
        bar.set_description(f"partition: {solver} ({adjncy.shape[0]:,} entries)")
        t2 = time.perf_counter()
        part_of_orig = run_kaminpar(xadj, adjncy, num_parts, vweights=vweights, epsilon=tolerance - 1, seed=seed,
                                    threads=threads, tmp_dir=scratch_dir, compress=compress)
    else:
        bar.set_description("partition: sparsify")
        metis_xadj, metis_adjncy, eweights = sparsify(xadj, adjncy, budget=metis_edge_budget, seed=seed)
        bar.update()
        bar.set_description(f"partition: {solver} ({metis_adjncy.shape[0]:,} entries)")
        t2 = time.perf_counter()
        part_of_orig = run_metis(metis_xadj, metis_adjncy, num_parts, vweights=vweights, eweights=eweights,
                                 seed=seed)
        stats["metis_entries"] = int(metis_adjncy.shape[0])
        stats["sparsify_s"] = round(t2 - t1, 3)
        del metis_xadj, metis_adjncy, eweights
    bar.update()
    bar.set_description("partition: rebalance")
    t3 = time.perf_counter()
    part_of_orig, moves = rebalance(xadj, adjncy, part_of_orig, train_mask, num_parts,
                                    balance_train=balance_train, tolerance=tolerance,
                                    edge_weight=degrees(indptr) if balance_edges else None, node_type=node_type)
    bar.update()
    bar.close()
    stats.update(moves)
    stats.update({"adjacency_s": round(t1 - t0, 3), f"{method}_s": round(t3 - t2, 3),
                  "rebalance_s": round(time.perf_counter() - t3, 3)})
    return part_of_orig
