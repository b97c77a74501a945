"""Train stage: DDP training of a GNN, one rank per partition, launched with torchrun (docs/design.md).

- ``stage``: the stage module (``Params``, ``run``, ``report``); ``launcher``: torchrun in its own session with
  streamed logs and process-group teardown; ``worker``: one rank's entry point (``python -m stages.train.worker
  --spec``): process group, device, threads, error record.
- A rank's rooms: ``rank_data`` (its partition, features and cache, read from the artifacts), ``loader`` (seeds →
  sampled batch → feature rows → labels, in lockstep), ``trainer`` (model, DDP, optimiser, the epoch loop),
  ``stats`` (an epoch's metrics, all-reduced), ``checkpoint`` (atomic save, resume agreement), ``rng`` (per-epoch
  reseeded streams), ``faults`` (test-only fault injection).
- ``spec``: what the launcher hands the ranks; ``cache_policy``: which gids each rank caches; ``model``, ``loop``:
  the GNN and the epoch/evaluation loops; ``model_contract``: the flags a model declares (``BlockModel``) and their
  one reader; ``encoder``: the node model built from the params, for the trainer and inference; ``plot``: the
  report's figures.
- ``tasks/``: the Task seam and its registry (``TASKS``: node, link), what the trainer, this stage and hotness ask of
  a task instead of branching on its name.
"""
