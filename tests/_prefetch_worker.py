"""The ranks' side of ``test_prefetch``'s trainer runs (kept free of pytest: every spawned rank imports it).

Each rank trains the same job twice through the real ``RankData`` and ``Trainer``: synchronously, then with a
prefetching producer thread on its own process group (``stages.train.rank.prefetch``). Every collective the producer
runs (sampling, rows, degrees, filtered negatives, learnt embeddings' gathers) must be on that group, or the
ranks' calls mix with the main thread's and the run hangs or differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stages.train.params import Params
from stages.train.rank.prefetch import producer_group
from stages.train.rank.rank_data import RankData
from stages.train.rank.trainer import Trainer
from stages.train.spec import TrainSpec
from tests._rank import run_gloo_rank

WORLD_SIZE = 2
TIMEOUT_S = 180


def run_rank(rank: int, root: str, keys: dict[str, str], params: dict[str, Any], work: str) -> dict:
    out: dict[str, Any] = {}
    for depth in (0, 1):
        run = Params(**{**params, "prefetch": depth})
        job = Path(work, f"prefetch{depth}", f"rank{rank}")   # both ranks are local rank 0: a directory each
        spec = TrainSpec(artifacts=root, key=f"prefetch{depth}", partition_key=keys["partition"],
                         features_key=keys["features"], hotness_key=keys["hotness"],
                         params=run.model_dump(mode="json"), checkpoint_dir=str(job / "ckpt"),
                         result_dir=str(job / "result"))
        data = RankData.open(spec, rank, WORLD_SIZE, WORLD_SIZE, torch.device("cpu"),
                             group=producer_group(depth))
        trainer = Trainer(spec, run, data)
        metrics = trainer.fit()
        out[str(depth)] = {"metrics": metrics, "state": trainer.published_state(),
                           "rng": trainer.rng.state_dict()}
    return out


def worker(rank: int, init_file: str, out_dir: str, root: str, keys: dict[str, str], params: dict[str, Any],
           work: str) -> None:
    run_gloo_rank(rank, init_file, out_dir, WORLD_SIZE, TIMEOUT_S, lambda: run_rank(rank, root, keys, params, work))
