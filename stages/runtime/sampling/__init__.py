"""The rank's samplers: a batch's neighbourhood drawn from the CSR (``stages.runtime.csr``), on a CPU or a GPU.

- ``uniform``: one hop's uniform draws over a CSR of incoming edges (Floyd's subsets, torch ops only);
  ``weighted``: the same with edge-weighted draws.
- ``sampler``: the hop loop as PyG ``Data`` batches (``MultiHopSampler``), the ``NeighborSampler`` on one
  partition holding the whole graph, and the per-epoch seed batches.
- ``dist_sampler``: the same hop loop across partitions held by different ranks, with ``all_to_all_single``
  exchanges in lockstep (no RPC), plus equal per-rank batch counts.
- ``static_sampler``: a lone rank's uniform sampling straight into a batch of static shape (``static_shape``: the
  sizes every batch of a pass fits), with no host read, so that a CUDA graph can capture it.
- ``relabel``: gid -> batch-local position maps (first-occurrence order) that the samplers share.
- ``fanouts``: fanout validation without torch imports (config checks).

ID spaces: ``gid`` global, ``lid = gid - bounds[p]`` local to partition p, ``*_pos`` positions in a batch's ``n_id``.
"""
