"""Train stage: DDP training of a GNN, one rank per partition, launched with torchrun (docs/design.md).

A map of the rooms; each sub-package's own docstring names its modules.

- The stage (what the pipeline runs, in the flow's process): ``stage`` (``Params``, ``run``, ``report``; it starts the
  ranks with ``stages.jobs.launcher``), ``params`` (its parameters, torch-free: the config check reads them on every
  command), ``spec`` (what the stage hands the ranks), ``plot`` (the report's figures), ``report`` (the report's
  "where the time goes": the phases' summary and section).
- ``models``: the networks — the built-in SAGE/GCN/GAT, the relational and HGT models, the model contract, the one
  encoder builder the trainer and inference share, and plug-in models and losses by import path.
- ``tasks``: the Task seam and its registry ``TASKS`` (node, link) — what the trainer, this stage, hotness and infer
  ask of a task instead of branching on its name — and the link task's decoders and metrics.
- ``rank``: one rank's runtime, in the torchrun process — its entry point (``python -m stages.train.rank.worker``),
  the data it reads, the loader and prefetch, the trainer and its loops, checkpoints, the recipe and the cache
  policy.
"""
