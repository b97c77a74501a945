"""Train stage: DDP training of a GNN, one rank per partition, launched with torchrun (DESIGN.md §5).

- ``stage``: the stage module (``Params``, ``run``, ``report``); ``launcher``: torchrun in its own session with
  streamed logs and process-group teardown; ``worker``: one rank (``python -m stages.train.worker --spec``).
- ``spec``: what the launcher hands the ranks; ``cache_policy``: which gids each rank caches; ``model``, ``loop``:
  the GNN and the epoch/evaluation loops; ``plot``: the report's figures.
"""
