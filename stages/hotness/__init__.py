"""Hotness stage: pre-sample, count feature-row requests, and plan each rank's cache.

- ``stage``: the stage module (``Params``, ``run``, ``report``); ``units``: a group of parts planned as one unit of
  ``stages.executor``; ``whole_csr``: the whole graph's CSR for the sampler, assembled part by part.
- ``counting``: how often each gid's row is requested by one partition's batches; ``plan``: cache plans from those
  counts and the hit-rate curves; ``plot``: the hit-rate figure.
"""
