"""Download stage: dataset sources (synthetic, OGB, the user's .npy files) → a canonical ``storage.graph.Graph``.

- ``stage``: the stage module (``Params``, ``run``, ``report``); ``streamed``: which path builds the graph under
  ``memory_budget_bytes``; ``canonical``: edge lists → the canonical CSR of incoming edges.
- Sources: ``synthetic`` (a products-like graph), ``synthetic_hetero`` (a MAG-like typed graph), ``ogb_source``
  (OGB node-property datasets), ``ogbl_source`` (OGB link-property datasets), ``files_source`` (the user's ``.npy``
  files), ``typed_files`` (the user's typed graph), ``typed`` (typed sources → one ``Graph``).
- Link prediction: ``edge_split`` (held-out edges and the message-passing graph), ``edge_split_stream`` (the same
  split of a graph larger than memory).
"""
