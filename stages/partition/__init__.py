"""Partition stage: split the graph into P parts and relabel it so that each part owns a contiguous gid range.

The computation lives in pure numpy / pymetis / kaminpar modules, the stage wrapper (``stage``) only does I/O:

- ``assign``: ``assign_parts`` -> ``part_of_orig`` (METIS, KaMinPar or balanced random), then ``balance`` repairs
  train-node and node balance, because pymetis 2025.2.2 silently ignores multi-constraint vertex weights.
- ``kaminpar_runner``: ``run_kaminpar``, the adjacency handed to KaMinPar through a ParHIP file.
- ``adjacency``: the symmetric, self-loop-free (and, for big graphs, sparsified) adjacency METIS is given; on the
  streamed path a directed or typed graph's comes from the external sort (``stages.external_sort``).
- ``relabel``: ``relabel`` -> ``PartitionBook``; ``build_part_csr`` -> one part's incoming-edge CSR in gids.
- ``report``: ``partition_report`` -> edge cut and per-part sizes / imbalance (JSON-able).
- ``csr_ops``: chunked, vectorised CSR helpers shared by the above.
- ``footprint``: the stage's memory plan under ``memory_budget_bytes`` (in-memory or streamed; the one-line errors).
- ``streamed``: the streamed path, the graph memory-mapped from the scratch dir and the parts written in chunks.
- ``units``: the part writes as units of a Dask executor (``stages.executor``), each a group of parts written by
  the streamed writer on a worker.

ID spaces are named in every variable: ``orig`` (dataset ids), ``gid`` (after relabel), ``lid`` (gid - bounds[p]).
"""
