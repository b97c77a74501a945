"""Pipeline stages. Each stage is one module, ``stages/<name>/stage.py``, satisfying ``stages.protocol.Stage``:

``run(store, params, upstream manifests) -> manifest`` writes one artifact through ``storage``;
``report(manifest) -> Report`` turns its summary into something a person reads. ``Params`` (a
``stages.params.StageParams``) is the one place each of its parameters is declared.

The stages: ``download``, ``partition``, ``features``, ``hotness``, ``train``, ``infer``.

Not stages: ``runtime`` (samplers and the feature path, shared by hotness, train and infer), ``jobs`` (the launcher
of train's and infer's ranks), ``tracking`` (TensorBoard event files and MLflow runs), ``params`` (the Params
bases), ``choices`` (the enumerations users pick from), ``protocol`` (the Stage contract), ``memory`` (the
preprocessing memory budget), ``executor`` (where a data stage's parallel units run: here, a local Dask cluster or a
scheduler), ``external_sort`` and ``sort_units`` (the download's bucket sort of a graph larger than memory, and its
units on an executor), ``meter`` (wall time and peak memory of a stage), ``run_log`` (where a stage's progress lines
go) and ``code_files`` (the source files a module runs: a plug-in's code in the train key, the stages' code
digests). See docs/design.md §1.
"""
