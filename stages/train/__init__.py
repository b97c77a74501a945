"""Train stage: DDP training of a GNN, one rank per partition, launched with torchrun (docs/design.md).

- ``stage``: the stage module (``Params``, ``run``, ``report``), which starts the ranks with ``stages.jobs.launcher``;
  ``params``: its parameters (torch-free); ``spec``: what the stage hands the ranks; ``worker``: one rank's entry
  point (``python -m stages.train.worker --spec``): process group, device, threads, error record; ``plot``: the
  report's figures.
- A rank's rooms: ``rank_data`` (its partition, features and cache, read from the artifacts), ``typed_data`` (the
  same for a typed graph), ``loader`` (seeds → sampled batch → feature rows → labels, in lockstep), ``prefetch``
  (the next batch prepared while the model computes), ``trainer`` (model, DDP, optimiser, the epoch loop), ``loop``
  (the epoch and evaluation loops), ``recipe`` (best-validation selection, early stopping, LR schedule), ``stats``
  (an epoch's metrics, all-reduced), ``guard`` (a NaN/Inf loss stops every rank), ``checkpoint`` (atomic save,
  resume agreement), ``rng`` (per-epoch reseeded streams), ``faults`` (test-only fault injection), ``cache_policy``
  (which gids each rank caches).
- Tasks: ``tasks`` (the package of the Task seam and its registry ``TASKS``: node, link; what the trainer, this
  stage and hotness ask of a task instead of branching on its name), ``link_decoders`` (a pair's score and the
  loss), ``link_metrics`` (OGB's link metrics over all ranks).
- Models: ``model`` (the built-in SAGE/GCN/GAT), ``blocks`` (per-layer computation on a sampled batch), ``hgt`` (HGT
  on blocks), ``typed_model`` (R-GCN, R-GAT, an MLP baseline and the typed input), ``model_contract`` (the flags a
  model declares, ``BlockModel``, and their one reader), ``encoder`` (the node model built from the params, for the
  trainer and inference).
- Plug-ins: ``plugins`` (a model or loss by import path), ``plugin_names`` (whether the named callable exists, read
  from source before any stage runs), ``plugin_code`` (the digest of its code in the key and the fingerprint).
"""
