"""The job spec the infer stage writes for its ranks (a JSON file): artifacts by key, where the ranks write."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stages.runtime.rank_process import JobSpec


@dataclass
class InferSpec(JobSpec):
    JOB = "infer"

    artifacts: str            # artifact store root (local path or fsspec URL)
    key: str                  # the infer artifact's key
    partition_key: str
    features_key: str
    train_key: str
    params: dict[str, Any]    # stages.infer.params.Params, all fields (runtime ones included)
    out_url: str              # the artifact being written (StageWriter.url): each rank writes its part-<p>.zarr
    result_dir: str           # local: rank 0 writes ranks.json, a failing rank error-<r>.json (storage.infer)
    scratch_dir: str          # local: layer matrices past the host memory budget, mapped (stages.infer.matrices)
