"""Training runtime shared by the hotness and train stages.

- ``sampler``: uniform neighbour sampling over a CSR of incoming edges (torch ops only, CPU or CUDA), the multi-hop
  ``NeighborSampler`` on one partition holding the whole graph, and the per-epoch seed iterator.
- ``dist_sampler``: the same multi-hop sampler across partitions held by different ranks, with ``all_to_all_single``
  exchanges in lockstep (no RPC), plus equal per-rank batch counts.
- ``relabel``: gid -> batch-local position maps (first-occurrence order) used by both samplers.
- ``fanouts``: fanout validation without torch imports (config checks).
- ``seeds``: the named random streams of hotness and train, one seed per (seed, rank, epoch, stream); torch-free.
- ``feature_store``: a rank's own ``x`` rows by lid, in (pinned) RAM or read chunk-wise from Zarr past a budget.
- ``feature_cache``: the device cache of a fixed set of gids (mechanism; the policy lives in ``stages.train``).
- ``dist_features``: a batch's rows by gid: cache, then own store, then remote owners via ``all_to_all_single``.
- ``collectives``: the group's device and the variable-split all-to-all both exchanges above use.

ID spaces: ``gid`` global, ``lid = gid - bounds[p]`` local to partition p, ``*_pos`` positions in a batch's ``n_id``.
"""
