"""One epoch's metrics, global over ranks: the record ``metrics.json`` keeps per epoch, all-reduced in one place."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.distributed as dist

from stages.runtime.collectives import all_reduce_f64
from stages.runtime.dist_features import FeatureCounters
from stages.runtime.sums import FieldSums
from stages.train.rank.loop import EpochSums
from storage.phases import PHASES
from storage.report import percent


def or_none(value: float) -> float | None:
    """``value``, or None for NaN: a metric over an empty split (``Task.metric``), written as JSON null."""
    return None if math.isnan(value) else value


@dataclass
class _Totals(FieldSums):
    """One rank's sums of an epoch that add over ranks (beside its ``FeatureCounters``), all-reduced together."""

    loss_sum: float
    seeds: int
    sampled_edges: int


def _per_rank(splits: list[dict[str, float]]) -> list[dict[str, list[float]]]:
    """Each of this rank's phase splits as {phase: [every rank's seconds]}: one SUM all-reduce of a vector in which
    each rank fills its own slots (a collective). A split no rank measured (no prefetch) comes back empty."""
    rank, world = dist.get_rank(), dist.get_world_size()
    width = len(PHASES)
    mine = [0.0] * (len(splits) * world * width)
    for k, split in enumerate(splits):
        for i, name in enumerate(PHASES):
            mine[(k * world + rank) * width + i] = split.get(name, 0.0)
    summed = all_reduce_f64(mine)
    out = []
    for k in range(len(splits)):
        block = summed[k * world * width:(k + 1) * world * width]
        by_phase = {name: [block[r * width + i] for r in range(world)] for i, name in enumerate(PHASES)}
        out.append(by_phase if any(any(v) for v in by_phase.values()) else {})
    return out


@dataclass(frozen=True)
class EpochStats:
    """Field names are the per-epoch keys of ``metrics.json`` (``metrics["epochs"][i]``), which the stage's summary
    and report (``stages.train.stage``) and the figures (``stages.train.plot``) read. Every value is global."""

    epoch: int                   # 0-based
    loss: float                  # mean loss (the task's) over all ranks' real (non-padding) train seeds
    # the task's selected metric (``Task.metric_name``, beside them in metrics.json: accuracy, or link prediction's
    # mrr); the keys before train VERSION 6 were train_acc / val_acc (``storage.train_summary`` reads both)
    train_metric: float          # over the same seeds, in train mode (dropout on)
    val_metric: float            # global validation metric after the epoch (OGB Evaluator's); selects the model;
                                 # NaN in memory, None in as_dict() and metrics.json, when the valid split is empty
    lr: float                    # the learning rate of this epoch (lr_schedule)
    epoch_s: float               # the slowest rank's training pass
    eval_s: float                # the slowest rank's validation pass
    train_items: int             # all ranks' real train items of the epoch: seed nodes, or positive edges
    batches: int                 # per rank, padding included (equal on every rank)
    sampled_edges: int           # all ranks' sampled edges of the epoch's train batches
    sampled_edges_per_s: float   # sampled_edges / epoch_s
    hit_rate: float              # cached_rows / requested_rows
    requested_rows: int          # feature rows asked for by all ranks' batches (the rows of every n_id)
    cached_rows: int             # of which served by the device caches
    local_rows: int              # by the ranks' own stores
    remote_rows: int             # by other ranks
    cached_bytes: int
    local_bytes: int
    remote_bytes: int
    # each rank's training pass split into phases (``storage.phases``): {phase: [seconds on rank 0, 1, ...]}; the
    # model's thread (adds up to the rank's pass), and the prefetch producer's overlapped work ({} without prefetch)
    phases_s: dict[str, list[float]] = field(default_factory=dict)
    prefetch_phases_s: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def reduce(cls, epoch: int, sums: EpochSums, traffic: FeatureCounters, *,
               metric: Callable[[Sequence[float]], float], val_metric: float, eval_s: float, lr: float) -> EpochStats:
        """The global record from this rank's ``sums`` (``loop.train_epoch``) and feature ``traffic`` of the epoch.

        A collective: one SUM all-reduce of the counts, one MAX all-reduce of the wall times. ``metric``: the task's,
        from the summed ``sums.metric_sums``; ``val_metric`` is global already; ``batches`` is equal on every rank.
        """
        totals = _Totals(loss_sum=sums.loss_sum, seeds=sums.seeds, sampled_edges=sums.sampled_edges)
        n, m = len(_Totals.names()), len(FeatureCounters.names())
        summed = all_reduce_f64([*totals.values(), *traffic.values(), *sums.metric_sums])
        total, rows = _Totals.from_values(summed[:n]), FeatureCounters.from_values(summed[n:n + m])
        epoch_s, eval_s = all_reduce_f64([sums.wall_s, eval_s], op=dist.ReduceOp.MAX)
        phases, prefetch = _per_rank([sums.phases_s, sums.prefetch_phases_s])
        edges = total.sampled_edges
        return cls(epoch=epoch, loss=total.loss_sum / max(total.seeds, 1), train_metric=metric(summed[n + m:]),
                   val_metric=val_metric, lr=lr, epoch_s=epoch_s, eval_s=eval_s, train_items=total.seeds,
                   batches=sums.batches, sampled_edges=edges, sampled_edges_per_s=edges / max(epoch_s, 1e-9),
                   hit_rate=rows.cache_hits / max(rows.requested_rows, 1), requested_rows=rows.requested_rows,
                   cached_rows=rows.cache_hits, local_rows=rows.local_rows, remote_rows=rows.remote_rows,
                   cached_bytes=rows.cached_bytes, local_bytes=rows.local_bytes, remote_bytes=rows.remote_bytes,
                   phases_s=phases, prefetch_phases_s=prefetch)

    def as_dict(self) -> dict[str, Any]:
        """The record of ``metrics.json``: JSON-ready, a metric over an empty split None."""
        return {k: (or_none(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def log_line(self, epochs: int, metric: str = "accuracy") -> str:
        """One line for the job log, ``epochs`` being the run's total; ``metric``: the task's (``Task.metric_name``;
        accuracy in percent, any other as a number)."""
        def shown(value: float) -> str:
            return percent(value, 1) if metric == "accuracy" or math.isnan(value) else f"{metric} {value:.4f}"

        train, val = shown(self.train_metric), shown(self.val_metric)
        return (f"epoch {self.epoch + 1}/{epochs}: loss {self.loss:.4f}, train {train}, "
                f"val {val} | {self.epoch_s:.2f} s, {self.sampled_edges_per_s / 1e6:.2f} M "
                f"edges/s | cache hit {100 * self.hit_rate:.1f} %, remote {self.remote_rows:,} rows "
                f"({self.remote_bytes / 2**20:.1f} MiB)")
