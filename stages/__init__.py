"""Pipeline stages. Each stage is one module, ``stages/<name>/stage.py``, satisfying ``stages.protocol.Stage``:

``run(store, params, upstream manifests) -> manifest`` writes one artifact through ``storage``;
``report(manifest) -> Report`` turns its summary into something a person reads. ``Params`` (a
``stages.params.StageParams``) is the one place each of its parameters is declared.

Not stages: ``runtime/`` (samplers and the feature path, shared by hotness and train), ``jobs/`` (the launcher
of train's and infer's ranks), ``params``, ``choices`` (the enumerations users pick from), ``protocol`` and
``meter`` (wall time and peak memory of a stage). See docs/design.md §1.
"""
