"""Pipeline stages. Each stage is one module (``stages/<name>/stage.py``) with one contract:

``run(store, params, upstream manifests) -> manifest`` writes one artifact directory through ``storage``;
``report(manifest) -> Report`` turns its summary into something a person reads.
"""
