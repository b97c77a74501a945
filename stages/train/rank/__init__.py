"""The rank room: one training rank's runtime, in the process torchrun starts (one per partition).

- ``worker``: the entry point (``python -m stages.train.rank.worker --spec JOB.json``): process group, device,
  threads, error record; it only wires the others together.
- ``rank_data``: what the rank reads of the artifacts, its only reader (its partition, features and cache; at the
  end, the order of the published embedding tables); ``typed_data``: the same for a typed graph.
- ``cache_policy``: which gids the rank caches on its device (policy; the mechanism is ``stages.runtime``);
  ``cache_budget``: how many bytes of them, decided where the rank runs (a GPU's free memory).
- ``loader``: seeds → sampled batch → feature rows, in lockstep; ``prefetch``: the next batch prepared
  while the model computes.
- ``trainer``: task, model, DDP, optimiser and the run; ``loop``: the epoch and evaluation loops; ``recipe``:
  best-validation selection, early stopping, the LR schedule; ``stats``: an epoch's metrics, all-reduced.
- ``graphed``: a lone CUDA rank's training step as one captured CUDA graph (``cuda_graph=step`` or ``auto``);
  ``static_batch``: the batches padded to the static shape it replays; ``graphed_sampling``: the sampling of a
  batch as one captured graph too (``cuda_graph=auto``).
- ``checkpoint``: atomic save and resume agreement; ``guard``: a NaN/Inf loss stops every rank; ``rng``: per-epoch
  reseeded streams; ``faults``: test-only fault injection.
"""
