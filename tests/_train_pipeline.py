"""Small graphs built through the real stages for the train tests (kept free of pytest: spawned ranks import it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from flows.direct import run_stages
from stages.train import stage as train
from storage import ArtifactStore, Manifest
from storage.train import METRICS, MODEL

# 8 000 nodes, 4 classes: big enough that test accuracy (5 600 test nodes) varies by < 1 point between seeds, small
# enough that an epoch takes a fraction of a second on one core per rank.
GRAPH: dict[str, Any] = {"num_nodes": 8000, "avg_degree": 10.0, "num_features": 16, "num_classes": 4, "seed": 1,
                         "split": (0.2, 0.1, 0.7)}
FANOUTS = (10, 5)
BATCH_SIZE = 64


def build_without_prefect(cfg_values: dict[str, Any]) -> tuple[ArtifactStore, dict[str, Manifest]]:
    """Run the stages of a pipeline config directly, as the flow's tasks do: (store, manifest per stage)."""
    return run_stages(cfg_values)


def build_upstream(store: ArtifactStore, num_partitions: int, graph: dict[str, Any] | None = None,
                   cache_ratio: float = 0.2, chunk_rows: int | None = None) -> dict[str, Manifest]:
    """download → partition → features → hotness for the train tests; returns every manifest by stage name."""
    values = {f"download.{k}": v for k, v in (graph or GRAPH).items()}   # the graph's seed is the dataset's only
    _, manifests = build_without_prefect({**values, "artifacts": store.root, "num_partitions": num_partitions,
                                          "chunk_rows": chunk_rows, "fanouts": FANOUTS, "batch_size": BATCH_SIZE,
                                          "cache_ratio": cache_ratio, "until": "hotness"})
    return manifests


def train_params(**overrides: Any) -> train.Params:
    """A small, fast SAGE run: 2 layers of 32, one thread per rank (two ranks share the 2-core CI box)."""
    values: dict[str, Any] = {"hidden": 32, "fanouts": FANOUTS, "batch_size": BATCH_SIZE,
                              "epochs": 8, "lr": 0.01, "dropout": 0.3, "seed": 0, "threads_per_rank": 1,
                              "timeout_s": 300.0, "peer_timeout_s": 60.0}
    values.update(overrides)
    return train.Params(**values)


def train_upstream(manifests: dict[str, Manifest]) -> dict[str, Manifest]:
    return {name: manifests[name] for name in train.UPSTREAM}


class TrainRun:
    """One train stage run: its manifest, metrics, model state and every log line with its arrival time."""

    def __init__(self, store: ArtifactStore, params: train.Params, upstream: dict, **kwargs) -> None:
        self.lines: list[tuple[float, str]] = []
        self.store, self.params, self.upstream = store, params, upstream
        self.manifest = train.run(store, params, upstream, log=lambda line: self.lines.append((time.monotonic(), line)),
                                  **kwargs)
        key = self.manifest.key
        self.metrics = json.loads(store.read_bytes("train", key, METRICS))
        self.state = torch.load(Path(store.url("train", key, MODEL)), weights_only=True)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)
