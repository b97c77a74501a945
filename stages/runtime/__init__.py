"""Training runtime shared by the hotness and train stages.

- ``sampler``: uniform neighbour sampling over a CSR of incoming edges (torch ops only, CPU or CUDA), the multi-hop
  ``NeighborSampler`` on one partition holding the whole graph, and the per-epoch seed iterator.
- ``dist_sampler``: the same multi-hop sampler across partitions held by different ranks, with ``all_to_all_single``
  exchanges in lockstep (no RPC), plus equal per-rank batch counts.
- ``relabel``: gid -> batch-local position maps (first-occurrence order) used by both samplers.
- ``fanouts``: fanout validation without torch imports (config checks).

ID spaces: ``gid`` global, ``lid = gid - bounds[p]`` local to partition p, ``*_pos`` positions in a batch's ``n_id``.
"""
