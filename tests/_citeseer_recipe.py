"""The published GCN recipe on CiteSeer (Kipf & Welling 2017) as a pipeline config: the CiteSeer test's, and the
benchmarks' that run it (bench_citeseer, bench_precision). The data is read from ``../shared/data/citeseer``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CITESEER = Path(__file__).resolve().parents[2] / "shared" / "data" / "citeseer"

# Kipf & Welling 2017 (Table 2, and ../shared/data/README.md): a 2-layer GCN, 16 hidden, dropout 0.5, L2 5e-4, Adam
# lr 0.01, 200 epochs, the model selected on validation, on row-normalised bag-of-words features. Fanouts -1: every
# neighbour, so the sampled GCN is the paper's full-graph GCN; a batch of 512 holds the 120 train seeds at once (the
# paper's full-batch step) and the 500 validation seeds too: the per-epoch validation pass is one batch, which halved
# its time (4.7 vs 8.7 s over 200 epochs with batches of 128, 1 partition). One thread per rank: 2 ranks, 2 cores.
RECIPE: dict[str, Any] = {"dataset": "files", "normalize": "l1", "fanouts": (-1, -1), "batch_size": 512,
                          "model": "gcn", "hidden": 16, "dropout": 0.5, "weight_decay": 5e-4, "lr": 0.01,
                          "epochs": 200, "seed": 0, "threads_per_rank": 1}
PUBLISHED_GCN = 0.703   # the paper's test accuracy of this recipe


def citeseer_config(num_partitions: int, artifacts: str | Path, **overrides: Any) -> dict[str, Any]:
    """The pipeline config of the published GCN recipe on CiteSeer (``overrides`` replace recipe values)."""
    return {**RECIPE, "path": str(CITESEER), "artifacts": str(artifacts), "num_partitions": num_partitions,
            **overrides}
