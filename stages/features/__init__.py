"""Features stage: per-partition Zarr stores of x, y and split lids.

- ``stage``: the stage module (``Params``, ``run``, ``report``); ``stream``: its one code path, each node type's x
  streamed from ``graph.zarr`` in row chunks into the partitions' stores; ``units``: a group of parts written as one
  unit of ``stages.executor``.
- ``dtypes``: the storage dtype and the checked cast into it; ``schemes``: the coding a ``dtype`` choice stores
  (the codec is ``stages.runtime.feature_codec``); ``normalize``: row normalisation of x.
"""
