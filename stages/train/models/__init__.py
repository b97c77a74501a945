"""The models room: the networks a train run learns and inference rebuilds.

- ``model``: the built-in SAGE/GCN/GAT and ``seed_logits``, the one entry point the loops call.
- ``blocks``: per-layer computation on a sampled batch (layout, aggregation, activation).
- ``hgt``: HGT on blocks.
- ``typed_model``: R-GCN, R-GAT, an MLP baseline and the typed input (``HeteroModel``).
- ``model_contract``: the capability flags a model declares (``BlockModel``) and their one reader.
- ``encoder``: the node model built from the params and the graph's sizes, one builder for the trainer and infer.
- ``plugins``: a model or loss by import path ``package.module:name``.
- ``plugin_names``: whether the named callable exists, read from source before any stage runs.
- ``plugin_code``: the digest of a plug-in's code in the train key and the nodes' fingerprint.

Import-light on purpose: this file imports nothing, so ``stages.train.params`` (torch-free, read by the config check
on every command) can import ``plugins``/``plugin_names``/``plugin_code`` without pulling torch in.
"""
