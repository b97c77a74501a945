"""The rank's runtime: code that runs inside each rank of the hotness, train and infer stages.

- ``sampling``: the samplers' sub-room (uniform and weighted draws, the multi-hop and distributed samplers, the
  static-shape sampler a CUDA graph captures, fanout checks); ``csr``: a partition's CSR as tensors on one device,
  what they sample; ``segments``: the index helpers over counted rows that the samplers and the model's blocks
  share, a CPU way and a GPU way without host synchronisations.
- ``seeds``: the named random streams of hotness and train, one seed per (seed, rank, epoch, stream); torch-free.
- ``feature_store``: a rank's own ``x`` rows by lid, in (pinned) RAM or read chunk-wise from Zarr past a budget;
  ``feature_codec``: stored rows → the float32 rows the model computes on; ``uva``: zero-copy GPU reads of pinned
  host memory (feature rows, a CSR).
- ``feature_cache``: the device cache of a fixed set of gids (mechanism; the policy lives in ``stages.train``).
- ``dist_features``: a batch's rows by gid: cache, then own store, then remote owners via ``all_to_all_single``.
- ``collectives``: the group's device, the one all-reduce and the variable-split all-to-all both exchanges use;
  ``sums``: records of counts and sums that add field by field, and per-batch sums kept on their device.
- Typed graphs: ``typed_batch`` (a typed batch as PyG's ``HeteroData``), ``typed_rows`` (its input rows per node
  type), ``sharded_embedding`` (learnable rows of a featureless type, sharded by owner).
- Link prediction: ``link_batch`` (positive pairs and their negatives as one node set), ``negatives`` (uniform
  negative draws and the real-edge check).
- ``rank_process``: what every rank process does around its work (the train and infer workers share it);
  ``phases``: where a training pass's time goes (a per-thread clock of named phases: wall clock, or CUDA events).

Not here: starting and stopping the ranks (``stages.jobs``), which runs in gnnpipe's own process.

ID spaces: ``gid`` global, ``lid = gid - bounds[p]`` local to partition p, ``*_pos`` positions in a batch's ``n_id``.
"""
