"""The trainer room: one rank's model, DDP wrapper, optimiser, random streams and history, and the run itself.

``fit`` resumes from the newest checkpoint any node holds, trains the remaining epochs on the rank's own train
nodes in equal-count batches (``loader``), all-reduces each epoch's metrics (``stats``), checkpoints every epoch
and finishes with the test pass. Every metric is global and DDP keeps the weights equal, so the result is the same
on every rank. Determinism (per-epoch reseeding of every stream) is ``rng``'s contract; the checkpoint's contents
are ``state_dict()`` plus the run's key (``checkpoint``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from stages.runtime.dist_features import FeatureCounters
from stages.train.checkpoint import resume_state, save_checkpoint
from stages.train.loader import NodeLoader
from stages.train.loop import EpochSums, OnBatch, ogb_accuracy_counts, predict, train_epoch
from stages.train.model import build_model
from stages.train.params import Params
from stages.train.rank_data import RankData
from stages.train.rng import RngStreams
from stages.train.spec import TrainSpec
from stages.train.stats import EpochStats, all_reduce_f64

BatchHook = Callable[[int, int], OnBatch | None]   # (rank, epoch) -> called before each batch, or None


class Trainer:
    def __init__(self, spec: TrainSpec, params: Params, data: RankData, *, local_rank: int = 0,
                 batch_hook: BatchHook | None = None) -> None:
        """``local_rank``: which rank of its node (local rank 0 keeps the node's checkpoints); ``batch_hook``: an
        optional per-epoch hook (the tests' fault injection, ``stages.train.faults``)."""
        self.spec, self.params, self.data = spec, params, data
        self.rank, self.world, self.device = data.rank, data.world, data.device
        self.local_rank, self.batch_hook = local_rank, batch_hook
        self.rng = RngStreams(params.seed, data.rank, data.device)
        self.loader = NodeLoader(data, params.fanouts, params.batch_size, shuffle_gen=self.rng.shuffle,
                                 sampler_gen=self.rng.sampler)
        torch.manual_seed(params.seed)   # same initial weights everywhere (DDP also broadcasts rank 0's)
        self.model = build_model(params.model, in_channels=data.num_features, hidden=params.hidden,
                                 out_channels=data.num_classes, num_layers=params.num_layers,
                                 dropout=params.dropout, heads=params.gat_heads).to(data.device)
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            self.model, device_ids=[data.device.index] if data.device.type == "cuda" else None)
        self.optimizer = torch.optim.Adam(self.ddp.parameters(), lr=params.lr, weight_decay=params.weight_decay)
        self.history: list[dict[str, Any]] = []   # EpochStats.as_dict() of every completed epoch
        self.epoch = -1                            # the last completed epoch

    def fit(self) -> dict[str, Any]:
        """Train (resuming from the newest checkpoint), test, and return ``metrics.json`` (equal on every rank)."""
        resumed_from = self.resume()
        ranks: list[Any] = [None] * self.world
        dist.all_gather_object(ranks, self.data.setup)
        for epoch in range(self.epoch + 1, self.params.epochs):
            self.rng.seed_epoch(epoch)
            sums, traffic = self.train_epoch(epoch)
            eval_start = time.perf_counter()
            val_acc = self.evaluate("valid")
            stats = EpochStats.reduce(epoch, sums, traffic, val_acc=val_acc, eval_s=time.perf_counter() - eval_start,
                                      row_bytes=self.data.features.store.row_bytes)
            self.history.append(stats.as_dict())
            self.epoch = epoch
            self.save_checkpoint()
            if self.rank == 0:
                print(stats.log_line(self.params.epochs), flush=True)
        self.rng.seed_epoch(self.params.epochs)   # the test pass draws its own reproducible stream
        return self.metrics(self.evaluate("test"), resumed_from, ranks)

    def train_epoch(self, epoch: int) -> tuple[EpochSums, FeatureCounters]:
        """One pass over this rank's train batches: the loop's sums and the feature traffic of the epoch."""
        self.data.features.reset_counters()
        hook = self.batch_hook(self.rank, epoch) if self.batch_hook is not None else None
        sums = train_epoch(self.ddp, self.optimizer, self.loader.train_batches(), self.loader.sample,
                           self.loader.gather_rows, self.loader.label_of,
                           num_real_batches=self.loader.num_real_train_batches, device=self.device, on_batch=hook)
        return sums, self.data.features.reset_counters()

    def evaluate(self, split: str) -> float:
        """Global accuracy on ``split`` (a collective: all ranks' correct / total)."""
        seed_gid, y_pred = predict(self.model, self.loader.eval_batches(split), self.loader.sample,
                                   self.loader.gather_rows, self.device)
        local_correct, local_total = ogb_accuracy_counts({"y_true": self.loader.label_of(seed_gid)[:, None],
                                                          "y_pred": y_pred[:, None]})
        correct, total = all_reduce_f64([local_correct, local_total])
        return correct / total if total else 0.0

    # ---- state ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A checkpoint's contents but the run key. A collective: every rank's RNG states are gathered, so that
        any node's copy resumes every rank (torchrun may give a node other global ranks next time)."""
        rng: list[Any] = [None] * self.world
        dist.all_gather_object(rng, self.rng.state_dict())
        return {"epoch": self.epoch, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": rng, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.load_state_dict(state["rng"][self.rank])
        self.history, self.epoch = state["history"], int(state["epoch"])

    def resume(self) -> int | None:
        """Load the newest checkpoint of this run that any node holds; the epoch it was taken after, or None."""
        ckpt = resume_state(self.spec.checkpoint_dir, self.spec.key, rank=self.rank, world=self.world,
                            local_rank=self.local_rank)
        if ckpt is None:
            return None
        self.load_state_dict(ckpt)
        print(f"resuming from the checkpoint after epoch {self.epoch}", flush=True)
        return self.epoch

    def save_checkpoint(self) -> None:
        """Every rank joins (``state_dict`` is a collective); each node's local rank 0 writes its own copy."""
        state = self.state_dict()
        if self.local_rank == 0:
            save_checkpoint(self.spec.checkpoint_dir, self.epoch, {"key": self.spec.key, **state})

    def metrics(self, test_acc: float, resumed_from: int | None, ranks: list[Any]) -> dict[str, Any]:
        """``metrics.json`` (format in ``storage.train``); ``ranks``: every rank's ``RankData.setup``."""
        params, history = self.params, self.history
        best = max(history, key=lambda h: h["val_acc"]) if history else {"val_acc": 0.0, "epoch": -1}
        return {"epochs": history, "test_acc": test_acc, "best_val_acc": best["val_acc"],
                "best_epoch": best["epoch"], "final_val_acc": history[-1]["val_acc"] if history else 0.0,
                "world_size": self.world, "resumed_from_epoch": resumed_from, "ranks": ranks,
                "model": {"kind": params.model, "in_channels": self.data.num_features, "hidden": params.hidden,
                          "out_channels": self.data.num_classes, "num_layers": params.num_layers,
                          "parameters": sum(p.numel() for p in self.model.parameters())},
                "cache_policy": self.data.cache_policy, "device": str(self.device), "backend": dist.get_backend()}
