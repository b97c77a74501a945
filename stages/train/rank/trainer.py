"""The trainer room: one rank's task, model, DDP wrapper, optimiser and recipe, random streams and history, and the
run itself.

``fit`` resumes from the newest checkpoint any node holds, trains the remaining epochs on the rank's own seeds in
equal-count batches (``loader``), all-reduces each epoch's metrics (``stats``), keeps the best-validation weights and
stops early (``recipe``), checkpoints every epoch, and finishes with the test passes of the last and the best model.
What is learnt comes from the ``Task`` (``tasks``: seeds, labels, loss, metric); the model and the loss may be
plug-ins (``plugins``); a NaN or Inf loss stops every rank (``guard``). Every metric is global and DDP keeps the
weights equal, so the result is the same on every rank. Determinism (per-epoch reseeding of every stream) is
``rng``'s contract; the checkpoint's contents are ``state_dict()`` plus the run's key (``checkpoint``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.collectives import all_reduce_f64
from stages.runtime.dist_features import DistFeatures, FeatureCounters
from stages.runtime.phases import clock_kind
from stages.runtime.sampling.fanouts import graph_fanouts
from stages.runtime.sampling.static_shape import StaticShape
from stages.runtime.typed_rows import TypedRows
from stages.train.models.encoder import build_encoder
from stages.train.models.model import is_block_model, matmul_precision, needs_degrees
from stages.train.params import Params
from stages.train.rank.cache_budget import ranks_sharing_gpu
from stages.train.rank.checkpoint import resume_part, resume_state, save_checkpoint, save_replicated_part
from stages.train.rank.graphed import WARMUP_STEPS, GraphedStep, first_line, why_not_graphed
from stages.train.rank.graphed_sampling import SampleGraph, make_sample_graph, why_not_graphed_sampling
from stages.train.rank.guard import LossGuard
from stages.train.rank.loader import NodeLoader
from stages.train.rank.loop import EpochSums, OnBatch, eval_sums, train_epoch
from stages.train.rank.rank_data import RankData
from stages.train.rank.recipe import BestModel, make_scheduler
from stages.train.rank.rng import RngStreams
from stages.train.rank.stats import EpochStats, or_none
from stages.train.spec import TrainSpec
from stages.train.tasks import task_def
from stages.train.tasks.kinds import rank_share
from storage.errors import InputError
from storage.train import EMBEDDING_PREFIX

BatchHook = Callable[[int, int], OnBatch | None]   # (rank, epoch) -> called before each batch, or None


class Trainer:
    def __init__(self, spec: TrainSpec, params: Params, data: RankData, *, local_rank: int = 0,
                 local_world: int | None = None, batch_hook: BatchHook | None = None) -> None:
        """``local_rank``: which rank of its node (local rank 0 keeps the node's checkpoints); ``local_world``: the
        ranks per node (default: all on one); ``batch_hook``: an optional per-epoch hook (the tests' fault
        injection, ``stages.train.rank.faults``)."""
        # precision=auto resolved for this rank's device once: the task, the model, the graph's reasons and the
        # report all read the resolved one
        params = params.model_copy(update={"precision": params.rank_precision(data.device.type)})
        self.spec, self.params, self.data = spec, params, data
        self.rank, self.world, self.device = data.rank, data.world, data.device
        self.local_rank, self.batch_hook = local_rank, batch_hook
        self.local_world = data.world if local_world is None else local_world
        self.prefetch = params.prefetch_depth(data.device.type, data.world)
        if self.prefetch and dist.is_initialized() and data.group is None:
            raise ValueError("prefetch needs the batches' collectives on a group of their own: open the RankData "
                             "with group=stages.train.rank.prefetch.producer_group(prefetch)")
        self.rng = RngStreams(params.seed, data.rank, data.device)
        torch.set_float32_matmul_precision(matmul_precision(params.precision))   # tf32: the process's GEMMs
        self.task_def = task_def(params.task)
        self.task = self.task_def.build(params, data, self.rng.sampler)
        # the loader batches the task's items: seed gids, or link items under task=link (docs/design.md §4)
        split_items = {split: self.task.seeds(split) for split in data.split_gid}
        fanouts = graph_fanouts(params.fanouts, params.edge_fanouts, data.schema)
        epoch_items = self.task_def.epoch_items(params)
        if epoch_items is not None:   # each rank its share
            epoch_items = rank_share(epoch_items, int(split_items["train"].numel()))
        self.loader = NodeLoader(data, fanouts, params.batch_size, shuffle_gen=self.rng.shuffle,
                                 sampler_gen=self.rng.sampler, epoch_items=epoch_items, items=split_items,
                                 items_are_seeds=self.task.seeds_are_items)
        torch.manual_seed(params.seed)   # same initial weights everywhere (DDP also broadcasts rank 0's)
        in_channels = data.in_channels if data.in_channels is not None else data.num_features
        built = build_encoder(params, in_channels=in_channels, num_classes=data.num_classes, schema=data.schema,
                              num_edge_features=0 if data.edges is None else data.edges.num_features)
        self.model_kind, self.out_channels, self.edge_dim = built.kind, built.out_channels, built.edge_dim
        self.encoder = built.module
        # the encoder itself, or (task=link) the encoder whose embeddings feed a decoder
        self.model = self.task_def.wrap_model(self.encoder, params).to(data.device)
        # a typed graph's learnt rows of featureless types: sharded by owner, outside DDP (``sharded_embedding``)
        self.embeddings = data.features.embeddings if isinstance(data.features, TypedRows) else {}
        self.whole_batch = not is_block_model(self.encoder)
        self.loader.attach_degrees = needs_degrees(self.encoder)   # GCN's true degrees travel with each batch
        self.loader.attach_edges = self.edge_dim > 0               # so do the edges' ids and features then
        if self.whole_batch and self.rank == 0:
            print(f"model {self.model_kind} does not follow the block protocol (stages.train.models.model): "
                  f"each batch runs whole, every layer over every sampled node", flush=True)
        # what the training steps call: DDP's wrapper, whose backward all-reduces the gradients; a lone rank's model
        # itself, the same steps to the bit (DDP divides by a world of 1), without DDP's forward hooks and gradient
        # bucket copies: 0.7 ms of a products batch's host time on an H200 (benchmarks/RESULTS.md, [4/5])
        self.train_module: torch.nn.Module = self.model if data.world == 1 else \
            torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[data.device.index] if data.device.type == "cuda" else None)
        # None: each training step replays a captured CUDA graph (graphed), else why it cannot
        self.fanouts = fanouts
        self.not_graphed = why_not_graphed(
            params.cuda_graph, device=self.device, world=self.world, task=self.task, loss=params.resolved_loss,
            precision=params.precision, model=self.model, fanouts=fanouts, typed=not data.schema.is_homogeneous,
            edge_features=self.edge_dim > 0)
        self._graph: GraphedStep | None = None   # the captured step, kept across passes while it holds
        # None: the producer's sampling is a captured graph too (graphed_sampling), else why it is not
        features = data.features
        self.not_graphed_sampling = why_not_graphed_sampling(
            self.not_graphed, setting=params.cuda_graph, csr=data.csr, fanouts=list(fanouts),
            num_nodes=data.schema.num_nodes,
            every_row_on_device=isinstance(features, DistFeatures) and features.holds_every_row)
        self._sample_graph: SampleGraph | None = None   # made and captured once, for every pass
        # fused on a GPU: one kernel a step for all the weights, where the default's per-op kernels are ~10 more
        # launches a batch on a launch-bound path (benchmarks/RESULTS.md, [4/5]); capturable for a graphed step
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=params.lr, weight_decay=params.weight_decay,
                                          fused=self.device.type == "cuda", capturable=self.not_graphed is None)
        self.scheduler = make_scheduler(self.optimizer, params)
        self.best = BestModel(params.patience)
        self.history: list[dict[str, Any]] = []   # EpochStats.as_dict() of every completed epoch
        self.epoch = -1                            # the last completed epoch

    def fit(self) -> dict[str, Any]:
        """Train (resuming from the newest checkpoint) until the last epoch or early stopping, test the last and the
        best-validation model, and return ``metrics.json`` (equal on every rank). The model is left holding the
        best-validation weights: the ones to publish."""
        resumed_from = self.resume()
        ranks: list[Any] = [None] * self.world
        dist.all_gather_object(ranks, self.data.setup)
        while self.epoch + 1 < self.params.epochs and not self.best.should_stop(self.epoch):
            epoch = self.epoch + 1
            self.rng.seed_epoch(epoch)
            lr = float(self.optimizer.param_groups[0]["lr"])
            sums, traffic = self.train_epoch(epoch)
            eval_start = time.perf_counter()
            if self.task_def.reseeds_validation:
                self.rng.seed_validation()
            val_metric = self.task.metric(self.evaluate("valid"))
            stats = EpochStats.reduce(epoch, sums, traffic, metric=self.task.metric, val_metric=val_metric,
                                      eval_s=time.perf_counter() - eval_start, lr=lr)
            improved = self.best.update(epoch, val_metric, self.model, self._embedding_weights())
            if self.scheduler is not None:
                self.scheduler.step()
            self.history.append(stats.as_dict())
            self.epoch = epoch
            self.save_checkpoint()
            if self.rank == 0:
                best = improved and not math.isnan(val_metric)   # without validation every epoch "improves"
                print(stats.log_line(self.params.epochs, self.task.metric_name) + (" | best" if best else ""),
                      flush=True)
        stopped_early = self.epoch + 1 < self.params.epochs
        if stopped_early and self.rank == 0:
            print(f"early stop after epoch {self.epoch + 1}: no better validation {self.task.metric_name} for "
                  f"{self.params.patience} epochs (best: epoch {self.best.epoch + 1})", flush=True)
        test_last = self.test()
        test_best = test_last
        if self.best.epoch != self.epoch and self.best.state is not None:
            self.model.load_state_dict(self.best.state)
            self._load_embedding_weights(self.best.extra)
            test_best = self.test()
        return self.metrics(test_best, test_last, stopped_early, resumed_from, ranks)

    def train_epoch(self, epoch: int) -> tuple[EpochSums, FeatureCounters]:
        """One pass over this rank's train batches: the loop's sums and the feature traffic of the epoch."""
        self.data.features.reset_counters()
        sums = self.run_batches(self.loader.train_batches(), self.loader.num_real_train_batches, epoch)
        return sums, self.data.features.reset_counters()

    def run_batches(self, items: Iterable[Tensor], num_real: int, epoch: int) -> EpochSums:
        """Train on ``items`` (batches of the task's items, the first ``num_real`` real) as an epoch's pass does:
        the loss guard, the embeddings' step and prefetch included (the benchmarks time this)."""
        hook = self.batch_hook(self.rank, epoch) if self.batch_hook is not None else None

        def on_batch(b: int) -> None:
            if b == 1:   # the first step's gradients are still there: before batch 1 zeroes them
                self._check_every_parameter_learns()
            if hook is not None:
                hook(b)
        graph = self._graph_step() if self.not_graphed is None else None
        sample = self._graphed_sampling() if graph is not None and self.not_graphed_sampling is None else None
        sums = train_epoch(self.train_module, self.optimizer, items, sample or self.loader.sample,
                           self.loader.gather_rows,
                           self.task, num_real_batches=num_real, device=self.device, on_batch=on_batch,
                           check_loss=LossGuard(self.rank, self.world, epoch),
                           after_step=None if graph is not None else self.loader.step_embeddings,
                           prefetch=self.prefetch, gather_after_step=bool(self.embeddings), graph=graph)
        if graph is not None and graph.failed is not None:   # the next passes train eagerly from the start
            self.not_graphed, self._graph = graph.failed, None
            self.not_graphed_sampling = f"the step is not graphed ({graph.failed})"
        if sums.padding_rows and isinstance(self.data.features, DistFeatures):   # the counters: real rows only
            self.data.features.uncount_cached(sums.padding_rows)
        return sums

    @functools.cached_property
    def static_shape(self) -> StaticShape:
        """The padded layout of a graphed rank's batches: what its step computes on and its static sampler
        writes, one shape for both (asked for only where ``why_not_graphed`` let the step be graphed)."""
        return StaticShape.bound(self.params.batch_size, self.fanouts, self.data.schema.num_nodes)

    @property
    def capture_batches(self) -> int:
        """Batches of the rank's first pass up to and including the one that captures its graphed step: the eager
        warm-up steps and the capture (0 where the step is not graphed). A capture is a one-time cost of the rank,
        so a benchmark runs these untimed."""
        return WARMUP_STEPS + 1 if self.not_graphed is None else 0

    def _graphed_sampling(self) -> SampleGraph | None:
        """The rank's sampling graph, made and captured before its first graphed pass (graphed_sampling); None
        when the static sampler itself failed there (the eager sampler serves this pass and the next)."""
        if self._sample_graph is None:
            fanouts = cast(list[int], list(self.fanouts))   # one count a hop: why_not_graphed_sampling checked
            try:   # its buffers: 4 bytes a node and the batch's slots, on a device the cache has filled
                sample_graph = make_sample_graph(self.data.csr, fanouts, self.static_shape,
                                                 replace=self.loader.sampler.replace, generator=self.rng.sampler)
            except torch.OutOfMemoryError as error:
                self.not_graphed_sampling = f"the static sampler's buffers do not fit: {first_line(error)}"
                return None
            if not sample_graph.prepare():
                self.not_graphed_sampling = sample_graph.unusable
                return None
            self._sample_graph = sample_graph
        return self._sample_graph

    def _graph_step(self) -> GraphedStep:
        """The graphed step of the next pass: the last pass's while its learning rate holds (a capture costs a
        device synchronisation and the allocator's cache), else a new one, warmed up by the rank's first."""
        lr = float(self.optimizer.param_groups[0]["lr"])
        if self._graph is None or self._graph.lr != lr:
            self._graph = GraphedStep(self.model, self.optimizer, self.task, self.static_shape, self.device,
                                      warmup=WARMUP_STEPS if self._graph is None else 0)
        return self._graph

    def _check_every_parameter_learns(self) -> None:
        """A parameter the loss never reaches fails DDP at its next step, with an error about reductions that does
        not name it; a lone rank, without DDP, would train on silently and fail only on several ranks. Checked
        after a pass's first step, on every rank (host only: which gradients exist)."""
        unused = [name for name, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        if unused:
            listed = ", ".join(unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
            raise InputError(f"model {self.model_kind}: the loss of a training batch reaches no gradient to "
                             f"{listed}: every parameter must take part in every step (DDP all-reduces each "
                             f"one); remove the unused ones or freeze them (requires_grad=False)")

    def evaluate(self, split: str) -> list[float]:
        """The task's metric sums on ``split``, every rank's added (a collective)."""
        # the training passes' sampling graph serves the evaluation too: a test pass of products is ~2 160 batches
        sample = self._graphed_sampling() if self.not_graphed is None and self.not_graphed_sampling is None else None
        local = eval_sums(self.model, self.loader.eval_batches(split), sample or self.loader.sample,
                          self.loader.gather_rows, self.task, prefetch=self.prefetch, device=self.device)
        return all_reduce_f64(local)

    def test(self) -> list[float]:
        """The test metric sums of the model as it is; every test pass draws the same stream (seeded as epoch
        ``epochs``), so the last and the best model are tested on the same sampled neighbourhoods (and, for link
        prediction, against the same negatives)."""
        self.rng.seed_epoch(self.params.epochs)
        return self.evaluate("test")

    # ---- state ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A checkpoint's contents but the run key and the ranks' parts (``part_state_dict``). A collective: every
        rank's RNG states are gathered, so that any node's copy resumes every rank (torchrun may give a node other
        global ranks next time)."""
        ranks: list[Any] = [None] * self.world
        dist.all_gather_object(ranks, {"rng": self.rng.state_dict()})
        best = {**self.best.state_dict(), "extra": None}
        return {"epoch": self.epoch, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "best": best, "ranks": ranks, "history": self.history}

    def part_state_dict(self) -> dict[str, Any]:
        """This rank's own part of a checkpoint: its embedding shards and their optimiser state, and its shards of
        the best epoch (typed graphs; stages.train.rank.checkpoint)."""
        return {"embeddings": {t: e.state_dict() for t, e in self.embeddings.items()},
                "best_embeddings": self.best.extra}

    def load_state_dict(self, state: dict[str, Any], part: dict[str, Any] | None = None) -> None:
        """``state`` (``state_dict``) and, with learnt embeddings, this rank's ``part`` (``part_state_dict``)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(self._with_own_flags(state["optimizer"]))
        self._graph = None   # the load made new state tensors: a captured step reads the old ones
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.best.load_state_dict({**state["best"], "extra": None if part is None else part["best_embeddings"]})
        self.rng.load_state_dict(state["ranks"][self.rank]["rng"])
        for name, emb in self.embeddings.items():
            assert part is not None, "a checkpoint of learnt embeddings has a part per rank"
            emb.load_state_dict(part["embeddings"][name])
        self.history, self.epoch = state["history"], int(state["epoch"])

    def _with_own_flags(self, optimizer_state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's optimiser state with this run's ``fused`` and ``capturable`` flags: the load keeps the
        saved groups', and they follow the device and ``cuda_graph``, runtime settings that a resumed run may
        change (a graphed GPU run's state resumed on a CPU would fail its first step; an eager run's resumed with
        a graph, its capture). Adam places its ``step`` counts by them as it loads."""
        own = [{k: g[k] for k in ("fused", "capturable") if k in g} for g in self.optimizer.param_groups]
        groups = [{**saved, **flags} for saved, flags in zip(optimizer_state["param_groups"], own)]
        return {**optimizer_state, "param_groups": groups}

    def _embedding_weights(self) -> dict[str, Any]:
        """This rank's embedding shards (CPU copies): what the best-validation model keeps beside its weights."""
        return {t: e.weight.detach().to("cpu", copy=True) for t, e in self.embeddings.items()}

    def _load_embedding_weights(self, weights: dict[str, Any] | None) -> None:
        if weights is None:
            return
        with torch.no_grad():
            for name, emb in self.embeddings.items():
                emb.weight.copy_(weights[name].to(emb.weight.device))

    def published_state(self) -> dict[str, Any]:
        """The model's ``state_dict`` plus, on a typed graph, ``embeddings.<type>``: each featureless type's whole
        table in tgid order (``stages.runtime.typed_rows``). A collective (the shards are gathered)."""
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        for name, emb in self.embeddings.items():
            shards: list[Any] = [None] * self.world
            dist.all_gather_object(shards, emb.weight.detach().cpu())
            state[f"{EMBEDDING_PREFIX}{name}"] = torch.cat(shards)
        return state

    def resume(self) -> int | None:
        """Load the newest checkpoint of this run that any node holds; the epoch it was taken after, or None."""
        ckpt = resume_state(self.spec.checkpoint_dir, self.spec.key, rank=self.rank, world=self.world,
                            local_rank=self.local_rank)
        if ckpt is None:
            return None
        part = resume_part(self.spec.checkpoint_dir, int(ckpt["epoch"]), rank=self.rank, world=self.world) \
            if self.embeddings else None
        self.load_state_dict(ckpt, part)
        # 1-based, as every epoch a person reads (the log lines, the report); the checkpoint keeps it 0-based
        print(f"resuming from the checkpoint after epoch {self.epoch + 1}/{self.params.epochs}", flush=True)
        return self.epoch

    def save_checkpoint(self) -> None:
        """Every rank joins (``state_dict`` is a collective); each node's local rank 0 writes its own copy, after
        every rank has written its part (typed graphs): a checkpoint on disk has all its parts."""
        state = self.state_dict()
        if self.embeddings:
            save_replicated_part(self.spec.checkpoint_dir, self.epoch, self.part_state_dict(), rank=self.rank,
                                 world=self.world, local_world=self.local_world)
            dist.barrier()
        if self.local_rank == 0:
            save_checkpoint(self.spec.checkpoint_dir, self.epoch, {"key": self.spec.key, **state})

    def metrics(self, test_sums: list[float], test_sums_last: list[float], stopped_early: bool,
                resumed_from: int | None, ranks: list[Any]) -> dict[str, Any]:
        """``metrics.json`` (format in ``storage.train``); ``ranks``: every rank's ``RankData.setup``."""
        params, history = self.params, self.history
        # an empty split has no metric: null in the JSON (NaN is not JSON), "n/a" in the report
        test, test_last = self.task.metric(test_sums), self.task.metric(test_sums_last)
        # *_metric: the task's selected metric (accuracy; link prediction's mrr), named by metric_name
        return {"epochs": history, "metric_name": self.task.metric_name, "test_metric": or_none(test),
                "test_metric_last": or_none(test_last), "test_metrics": self.task.metrics(test_sums),
                "best_val_metric": or_none(self.best.val), "best_epoch": self.best.epoch, "last_epoch": self.epoch,
                "final_val_metric": history[-1]["val_metric"], "stopped_early": stopped_early,
                "task": {"name": self.task.name, "evaluator": self.task.evaluator,
                         "metric": self.task.metric_name},
                "recipe": {"loss": params.resolved_loss, "lr": params.lr, "weight_decay": params.weight_decay,
                           "lr_schedule": params.lr_schedule, "patience": params.patience},
                "world_size": self.world, "resumed_from_epoch": resumed_from, "ranks": ranks,
                "model": {"kind": self.model_kind, "kwargs": params.model_kwargs,
                          "in_channels": self.data.in_channels or self.data.num_features,
                          "hidden": params.hidden, "out_channels": self.out_channels,
                          "num_layers": params.num_layers, "whole_batch": self.whole_batch,
                          **self.task_def.summary_model(params),
                          "parameters": sum(p.numel() for p in self.model.parameters())},
                "cache_policy": self.data.cache_policy, "device": str(self.device), "backend": dist.get_backend(),
                "phase_clock": clock_kind(self.device), "prefetch": self.prefetch,
                "precision": params.precision,   # as this rank resolved it (auto: tf32 on a GPU, else float32)
                "cuda_graph": self.graph_report(),
                "graphed_sampling": self.sampling_report(),
                "ranks_per_gpu": ranks_sharing_gpu(params, self.local_world) if self.device.type == "cuda" else None}

    def graph_report(self) -> str:
        """``metrics.json``'s ``cuda_graph``: on, or off: why."""
        return "on" if self.not_graphed is None else f"off: {self.not_graphed}"

    def sampling_report(self) -> str:
        """``metrics.json``'s ``graphed_sampling``: on, eager static sampling after a failed capture, or off: why."""
        if self.not_graphed_sampling is not None:
            return f"off: {self.not_graphed_sampling}"
        failed = self._sample_graph.failed if self._sample_graph is not None else None
        return "on" if failed is None else f"static, eager: {failed}"
