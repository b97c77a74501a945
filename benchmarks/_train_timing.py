"""Timing the train stage's own pass inside a benchmark's rank (``bench_train.py``): each (cache policy, step
settings) run on one load of the rank data, a fresh ``Trainer`` for each, and the figures a run reports.

Every rank calls the same functions in the same order: the measurements are collectives (the sums are all-reduced,
the wall time is the slowest rank's), and so are the caches' builds.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from _train_bench import RUNTIME  # benchmarks/ is on sys.path when run as a script

from stages.runtime.collectives import all_reduce
from stages.train.rank.cache_policy import cache_gids
from stages.train.rank.trainer import Trainer
from storage import ArtifactStore
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact

Run = tuple[str, dict[str, str]]   # (cache policy, the step's settings: cuda_graph, precision)


def time_batches(run: Callable[[Iterable[Any], int], Any], seed_batches: Iterable[Any], *, warmup: int,
                 max_batches: int) -> dict[str, Any]:
    """Run ``warmup`` untimed then ``max_batches`` timed training batches: ``run(items, num_real)`` trains on them
    and returns the pass's ``EpochSums``."""
    batches = iter(seed_batches)
    run(itertools.islice(batches, warmup), warmup)
    sums = run(itertools.islice(batches, max_batches), max_batches)
    if sums.batches == 0:
        raise ValueError(f"an epoch has no batch left after {warmup} warm-up batches: lower --warmup or "
                         f"--batch-size")
    return {"batches": sums.batches, "wall_s": sums.wall_s, "sampled_edges": sums.sampled_edges,
            # the split of the timed batches (stages.runtime.phases), and the prefetch thread's
            "phases_s": dict(sums.phases_s), "prefetch_phases_s": dict(sums.prefetch_phases_s)}


def warmup_batches(trainer: Trainer, warmup: int) -> int:
    """Untimed batches before the timed ones: ``warmup``, and for a graphed step at least its eager steps and the
    batch that captures it (a capture is a one-time cost of the pass, not of a batch)."""
    return max(warmup, trainer.capture_batches)


class RankTimer:
    """One rank's runs on its loaded ``data`` (``RankData``): ``measure`` and ``profile`` a (policy, settings) run,
    building the policy's cache where it changes and a trainer of those settings for each call."""

    def __init__(self, spec: Any, params: Any, data: Any, args: Any, batches_per_epoch: int) -> None:
        self.spec, self.params, self.data, self.args = spec, params, data, args
        self.batches_per_epoch = batches_per_epoch
        store = ArtifactStore(spec.artifacts)
        self.partition = PartitionArtifact(store, store.load("partition", spec.partition_key))
        self.hotness = HotnessArtifact(store, store.load("hotness", spec.hotness_key))
        self.cached = RUNTIME

    def trainer(self, policy: str, settings: dict[str, str]) -> Trainer:
        if policy != self.cached:   # "runtime": the cache RankData built (on a GPU: sized by the free memory and
            # the caps), as the train stage does; the others: that policy's plan (stages.train.rank.cache_policy)
            self.data.features.build_cache(torch.from_numpy(cache_gids(
                policy, partition=self.partition, hotness=self.hotness, rank=self.data.rank)))
            self.cached = policy
        trainer = Trainer(self.spec, self.params.model_copy(update={k: settings[k] for k in ("cuda_graph",
                                                                                             "precision")}), self.data)
        trainer.rng.seed_epoch(0)
        return trainer

    def measure(self, policy: str, settings: dict[str, str]) -> dict[str, Any]:
        """The stage's own pass (its loss guard, prefetch and, one rank, no DDP wrapper) over an epoch's first
        batches: every rank's sums (the slowest rank's wall time), rank 0's split of the time, the run's cache and
        the trainer's settings as it ran them."""
        got = self._measure(self.trainer(policy, settings))
        _release(self.data.device)   # the trainer went with _measure's frame
        return got

    def profile(self, policy: str, settings: dict[str, str]) -> dict[str, Any]:
        """``args.profile`` batches under torch.profiler after the warm-up (one rank: a profiled DDP rank would wait
        on peers that run no such batches)."""
        summary = self._profile(self.trainer(policy, settings))
        _release(self.data.device)
        return summary

    def _measure(self, trainer: Trainer) -> dict[str, Any]:
        features, args = self.data.features, self.args
        warmup = warmup_batches(trainer, args.warmup)
        features.reset_counters()
        timing = time_batches(lambda items, n: trainer.run_batches(items, n, epoch=0),
                              trainer.loader.train_batches(), warmup=warmup, max_batches=args.max_batches)
        c = features.reset_counters()   # warm-up and timed batches
        sums = all_reduce(torch.tensor([c.requested_rows, c.cache_hits, c.remote_rows, c.remote_bytes,
                                        c.local_bytes, timing["sampled_edges"]], dtype=torch.float64)).tolist()
        wall = all_reduce(torch.tensor([timing["wall_s"]], dtype=torch.float64), dist.ReduceOp.MAX).item()
        raw = {**dict(zip(("requested_rows", "cache_hits", "remote_rows", "remote_bytes", "local_bytes",
                           "sampled_edges"), sums)),
               "wall_s": wall, "batches": timing["batches"], "counted": warmup + args.max_batches,
               "phases_s": timing["phases_s"], "prefetch_phases_s": timing["prefetch_phases_s"],
               "round_ms": [round(wall * 1e3 / timing["batches"], 2)]}
        ran = {"cache_rows_per_rank": features.cache.num_rows, "cache_bytes_per_rank": features.cache.nbytes,
               **_settings(trainer)}
        return {"raw": raw, "settings": ran}

    def _profile(self, trainer: Trainer) -> dict[str, Any]:
        from _profile import profile_batches

        seeds = trainer.loader.train_batches()
        warmup = warmup_batches(trainer, self.args.warmup)
        trainer.run_batches(itertools.islice(seeds, warmup), warmup, epoch=0)

        def run() -> tuple[float, int]:
            sums = trainer.run_batches(itertools.islice(seeds, self.args.profile), self.args.profile, epoch=0)
            return sums.wall_s, sums.batches
        return profile_batches(run, cuda=self.data.device.type == "cuda")


def time_runs(runs: list[Run], timer: RankTimer, *, rounds: int, profile: bool,
              on_timed: Callable[[list[Run], list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """The figures of each run, in the order of ``runs``: the first policy's settings ``rounds`` times in
    alternating order (forward, backward, ...), so that the machine's drift weighs on each alike (on a CPU, six
    eager runs of one setting drifted 10 % in order), their figures over all their rounds' batches with each
    round's ms a batch beside them; then, with ``profile``, each of them profiled (after every timing of its cache:
    a profiler session leaves nothing behind in a timed run); then the other policies once each (their caches
    replace the first one's for good).

    ``on_timed(runs, figures)`` gets the first policy's runs and figures once they are timed, before the profiles:
    a profiler session that crashes (profiling CUDA graphs has, under some CUDA versions) loses no timing then."""
    first = [i for i, (policy, _) in enumerate(runs) if policy == runs[0][0]]
    others = [i for i in range(len(runs)) if i not in first]

    def figures_of(got: dict[str, Any]) -> dict[str, Any]:
        return {**_figures(got["raw"], timer.batches_per_epoch), **got["settings"]}
    measured: dict[int, dict[str, Any]] = {}
    for i in [i for k in range(rounds) for i in (first if k % 2 == 0 else first[::-1])]:
        got = timer.measure(*runs[i])
        measured[i] = got if i not in measured else {**got, "raw": _add(measured[i]["raw"], got["raw"])}
    figures = {i: figures_of(measured[i]) for i in first}
    if on_timed is not None:
        on_timed([runs[i] for i in first], [figures[i] for i in first])
    for i in first if profile else ():
        figures[i]["profile"] = timer.profile(*runs[i])
    figures.update({i: figures_of(timer.measure(*runs[i])) for i in others})
    return [figures[i] for i in range(len(runs))]


def _settings(trainer: Trainer) -> dict[str, Any]:
    """The trainer's settings as it ran them."""
    return {"prefetch": trainer.prefetch, "precision": trainer.params.precision,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_graph": trainer.graph_report(), "graphed_sampling": trainer.sampling_report()}


def _release(device: torch.device) -> None:
    """The last trainer's memory back (its caller dropped it) before the next is built: a captured graph holds a
    memory pool of its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two measurements summed field by field: numbers add, lists join, dicts (the phases) add key by key."""
    out = dict(a)
    for key, value in b.items():
        out[key] = value if key not in out else _add(out[key], value) if isinstance(value, dict) else \
            out[key] + value
    return out


def _figures(raw: dict[str, Any], batches_per_epoch: int) -> dict[str, Any]:
    """Per-batch rates of a measurement (summed over rounds) and its feature traffic per epoch."""
    s_per_batch, counted = raw["wall_s"] / raw["batches"], raw["counted"]   # counted: warm-up batches too
    per_epoch = batches_per_epoch / counted
    return {"s_per_batch": round(s_per_batch, 4), "epoch_s": round(s_per_batch * batches_per_epoch, 1),
            "rounds_ms_per_batch": raw["round_ms"],
            "hit_rate": round(raw["cache_hits"] / max(raw["requested_rows"], 1), 4),
            "remote_rows_per_epoch": round(raw["remote_rows"] * per_epoch),
            "remote_MiB_per_epoch": round(raw["remote_bytes"] * per_epoch / 2**20, 1),
            # rows that did not come from the device cache: on a GPU, what crossed host -> device
            "uncached_MiB_per_epoch": round((raw["local_bytes"] + raw["remote_bytes"]) * per_epoch / 2**20, 1),
            "sampled_edges_per_s": round(raw["sampled_edges"] / raw["wall_s"]),   # timed batches, all ranks
            # rank 0's split of the timed batches (stages.runtime.phases: CUDA events on a GPU), per batch
            "phases_ms_per_batch": {k: round(v * 1e3 / raw["batches"], 3) for k, v in raw["phases_s"].items()},
            # the prefetch thread's (sampling and gathering ahead; empty without prefetch)
            "prefetch_phases_ms_per_batch": {k: round(v * 1e3 / raw["batches"], 3)
                                             for k, v in raw["prefetch_phases_s"].items() if v}}
