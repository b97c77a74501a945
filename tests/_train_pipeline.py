"""Small graphs built through the real stages for the train tests (kept free of pytest: spawned ranks import it)."""

from __future__ import annotations

from typing import Any

from storage import ArtifactStore, Manifest
from stages.download import stage as download
from stages.features import stage as features
from stages.hotness import stage as hotness
from stages.partition import stage as partition
from stages.train import stage as train

# 8 000 nodes, 4 classes: big enough that test accuracy (5 600 test nodes) varies by < 1 point between seeds, small
# enough that an epoch takes a fraction of a second on one core per rank.
GRAPH: dict[str, Any] = {"num_nodes": 8000, "avg_degree": 10.0, "num_features": 16, "num_classes": 4, "seed": 1,
                         "split": (0.2, 0.1, 0.7)}
FANOUTS = (10, 5)
BATCH_SIZE = 64


def build_upstream(store: ArtifactStore, num_partitions: int, graph: dict[str, Any] | None = None,
                   cache_ratio: float = 0.2, chunk_rows: int | None = None) -> dict[str, Manifest]:
    """download → partition → features → hotness; returns every manifest by stage name."""
    dl = download.run(store, download.Params(**(graph or GRAPH)), {}, progress=False)
    pt = partition.run(store, partition.Params(num_partitions=num_partitions), {"download": dl}, progress=False)
    ft = features.run(store, features.Params(chunk_rows=chunk_rows), {"download": dl, "partition": pt},
                      progress=False)
    ht = hotness.run(store, hotness.Params(fanouts=FANOUTS, batch_size=BATCH_SIZE, cache_ratio=cache_ratio),
                     {"partition": pt, "features": ft}, progress=False)
    return {"download": dl, "partition": pt, "features": ft, "hotness": ht}


def train_params(**overrides: Any) -> train.Params:
    """A small, fast SAGE run: 2 layers of 32, one thread per rank (two ranks share the 2-core CI box)."""
    values: dict[str, Any] = {"hidden": 32, "num_layers": 2, "fanouts": FANOUTS, "batch_size": BATCH_SIZE,
                              "epochs": 8, "lr": 0.01, "dropout": 0.3, "seed": 0, "threads_per_rank": 1,
                              "timeout_s": 300.0, "collective_timeout_s": 60.0}
    values.update(overrides)
    return train.Params(**values)


def train_upstream(manifests: dict[str, Manifest]) -> dict[str, Manifest]:
    return {name: manifests[name] for name in train.UPSTREAM}
