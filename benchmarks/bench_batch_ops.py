"""What one training batch asks of the device, counted on a CPU: the ops a GPU would launch and the reads that
would stop its host, per part of the batch (issue [4/5] item 3, where a products batch is launch-bound).

Each op that reaches torch's dispatcher is counted (``TorchDispatchMode``), but those that launch nothing on a GPU
(views, bare allocations, wrapped scalars: ``NO_LAUNCH``).
With ``--ways gpu`` (the default) the code takes the paths it takes on a GPU, whatever the device: the GPU ways of
``stages.runtime.segments``, Floyd's pointer jumping, fused Adam; so the counts are a CPU's proxy for a GPU's kernel
launches (a GPU op may launch one kernel or several, and cuBLAS or cuSPARSE their own) and for its stream
synchronisations (``_local_scalar_dense``: ``.item()``, ``.tolist()``, ``bool()``; ``nonzero``, ``masked_select``
and the other ops whose output size the host must read). The figures are exact and repeatable, not timings.

One rank, the train stage's loop: ``Trainer.run_batches``'s preparation (``sample``: the task's seeds and the
sampled blocks; ``gather``: the input rows) and its step (``step``: the loss guard, forward, backward, optimiser,
the running sums). The graph: ``generate_synthetic`` at ``--nodes`` (products-like: average degree 50, 100
features, 47 classes), SAGE 3x256, fanouts [15, 10, 5], batch 1024::

    .venv/bin/python benchmarks/bench_batch_ops.py --nodes 200000 --batches 5

``--tree DIR`` counts another checkout of this repository (e.g. ``git worktree add /tmp/old REV``) with the same
script, for a before and after in one run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# ops that launch nothing on a GPU, left out of the counts: views, allocations without a fill, a Python scalar
# wrapped as a CPU tensor, a sparse tensor assembled from existing ones, the profiler's ranges
NO_LAUNCH = frozenset({"select", "slice", "view", "t", "detach", "as_strided", "squeeze", "unsqueeze", "expand",
                       "alias", "_unsafe_view", "reshape", "permute", "transpose", "unbind", "split", "chunk", "narrow",
                       "_reshape_alias", "split_with_sizes", "lift_fresh", "empty", "empty_like", "new_empty",
                       "empty_strided", "scalar_tensor", "sparse_compressed_tensor", "_record_function_enter_new",
                       "_record_function_exit"})
# ops after which a GPU's host waits for the device: a value read back, or an output sized by the data
HOST_READS = frozenset({"_local_scalar_dense", "tolist", "nonzero", "masked_select", "unique", "_unique2",
                        "unique_consecutive", "bincount", "repeat_interleave_no_size"})
PARTS = ("sample", "gather", "step")


# ``tolist`` reads a device tensor's values on a GPU, but reaches no dispatcher on a CPU: counted from Python. The
# loss guard's read of its host copy (``_raise_if_bad``, made without waiting) is not a device read.
HOST_COPY_READERS = frozenset({"_raise_if_bad"})


def counting_mode() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        """Counts ops by name; ``repeat_interleave`` without its output size is a host read on a GPU, and so is
        ``tolist`` (counted while the mode is on)."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter[str] = collections.Counter()
            self._tolist = torch.Tensor.tolist

        def __enter__(self) -> Any:
            tolist, ops = self._tolist, self.ops

            def counted(t: Any) -> Any:
                if sys._getframe(1).f_code.co_name not in HOST_COPY_READERS:
                    ops["tolist"] += 1
                return tolist(t)
            torch.Tensor.tolist = counted  # type: ignore[method-assign,assignment]
            return super().__enter__()

        def __exit__(self, *exc: Any) -> None:
            torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
            super().__exit__(*exc)

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            name = func.overloadpacket.__name__
            if name == "repeat_interleave" and (kwargs or {}).get("output_size") is None:
                name = "repeat_interleave_no_size"
            if name not in NO_LAUNCH:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    return Counter


@contextlib.contextmanager
def gpu_ways() -> Iterator[None]:
    """The paths a GPU takes, on this CPU, while the context lasts: segments' GPU way, Floyd's jumping (when this
    tree has it)."""
    import importlib

    import stages.runtime.segments as segments

    try:   # one hop's draws: their own module since the samplers' sub-room, stages.runtime.sampler before
        sampler: Any = importlib.import_module("stages.runtime.sampling.uniform")
    except ModuleNotFoundError:
        sampler = importlib.import_module("stages.runtime.sampler")

    patches: list[tuple[Any, str, Any]] = [(segments, "_gpu_way", lambda t, by_repeat: by_repeat is not False)]
    if hasattr(sampler, "_JUMP_FROM_K"):
        name = "floyd_offsets" if hasattr(sampler, "floyd_offsets") else "_floyd_offsets"   # its older name
        floyd_offsets = getattr(sampler, name)

        def floyd(deg: Any, k: int, generator: Any, *, by_jumping: bool | None = None) -> Any:
            if by_jumping is None:
                by_jumping = k >= sampler._JUMP_FROM_K and k * k * deg.numel() <= sampler._JUMP_MAX_PAIRS
            return floyd_offsets(deg, k, generator, by_jumping=by_jumping)
        patches.append((sampler, name, floyd))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def rank_data(args: argparse.Namespace) -> Any:
    """One partition holding the whole generated graph, its rows in memory (no cache)."""
    import numpy as np
    import torch

    from stages.download.synthetic import generate_synthetic
    from stages.runtime.csr import LocalCSR
    from stages.runtime.dist_features import DistFeatures
    from stages.runtime.feature_store import InMemoryFeatureStore
    from stages.train.rank.rank_data import RankData, degree_path
    from storage.schema import GraphSchema

    g = generate_synthetic(args.nodes, 50.0, 100, 47, seed=0)
    n = args.nodes
    csr, bounds, cpu = LocalCSR.from_numpy(g.indptr, g.indices), np.array([0, n]), torch.device("cpu")
    x = torch.from_numpy(np.ascontiguousarray(g.features["node"], dtype=np.float32))
    train_gid = torch.from_numpy(g.splits["train"].astype(np.int64))
    return RankData(rank=0, world=1, device=cpu, bounds=bounds, csr=csr,
                    features=DistFeatures(InMemoryFeatureStore(x), bounds), y_of_lid=torch.from_numpy(g.y).long(),
                    split_gid={"train": train_gid, "valid": train_gid[:1024], "test": train_gid[:1024]},
                    num_features=100, num_classes=47, cache_policy="none",
                    schema=GraphSchema.homogeneous(n, 100, 47), setup={}, degrees=degree_path(csr, bounds, cpu))


def count(args: argparse.Namespace) -> dict[str, Any]:
    """The counts per batch (module docstring), in a 1-rank gloo group of this process (destroyed at the end)."""
    import torch
    import torch.distributed as dist

    tmp = tempfile.mkdtemp(prefix="bench-batch-ops-")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
    try:
        with gpu_ways() if args.ways == "gpu" else contextlib.nullcontext():
            totals = _count_batches(args, tmp)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)
        torch.set_num_threads(threads)
    tree = Path(args.tree or HERE.parent).resolve()
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out: dict[str, Any] = {"tree": str(tree), "commit": commit.stdout.strip() or None, "ways": args.ways,
                           "cache": args.cache, "cuda_graph": args.cuda_graph, "nodes": args.nodes,
                           "batch_size": args.batch_size, "batches": args.batches}
    for part in PARTS:
        ops = {k: v / args.batches for k, v in totals[part].most_common()}
        out[part] = {"ops": round(sum(ops.values()), 1),
                     "host_reads": round(sum(v for k, v in ops.items() if k in HOST_READS), 1),
                     "reads": {k: v for k, v in ops.items() if k in HOST_READS},
                     "top": dict(list(ops.items())[:12])}
    out["batch"] = {"ops": round(sum(out[p]["ops"] for p in PARTS), 1),
                    "host_reads": round(sum(out[p]["host_reads"] for p in PARTS), 1)}
    return out


def _count_batches(args: argparse.Namespace, tmp: str) -> dict[str, collections.Counter[str]]:
    import torch

    from stages.runtime.sums import RunningSums
    from stages.train.params import Params
    from stages.train.rank.loop import EpochSums, Prepared, _graphed_step, _train_step
    from stages.train.rank.trainer import Trainer
    from stages.train.spec import TrainSpec

    spec = TrainSpec(artifacts=tmp, key="k", partition_key="p", features_key="f", hotness_key="h", params={},
                     checkpoint_dir=f"{tmp}/ckpt", result_dir=f"{tmp}/out")
    data = rank_data(args)
    if args.cache == "all":   # a lone GPU's default at products scale: every row in device memory
        data.features.build_cache(torch.arange(args.nodes))
    params = Params(model="sage", hidden=256, fanouts=(15, 10, 5), batch_size=args.batch_size)
    trainer = Trainer(spec, params, data)
    if args.ways == "gpu":   # fused Adam, as on a GPU (torch has a CPU kernel of it)
        trainer.optimizer = torch.optim.Adam(trainer.model.parameters(), lr=0.003, fused=True)
    # an older tree wraps one rank in DDP too
    train_module = trainer.train_module if hasattr(trainer, "train_module") else trainer.ddp  # type: ignore[attr-defined]
    guard = _guard(trainer)
    counter = counting_mode()
    totals = {part: collections.Counter[str]() for part in PARTS}
    sums = EpochSums(metric_sums=[0.0] * len(trainer.task.sum_names))
    running: Any = RunningSums(1 + len(trainer.task.sum_names))
    if "padding_rows" in EpochSums.__dataclass_fields__:   # this tree's loop keeps its counts apart
        running = (running, RunningSums(2))
    trainer.rng.seed_epoch(0)
    train_module.train()
    items = list(itertools.islice(trainer.loader.train_batches(), args.warmup + args.batches))
    if len(items) < args.warmup + args.batches:
        raise SystemExit(f"error: an epoch has {len(items)} batches, fewer than --warmup + --batches: lower them or "
                         f"--batch-size, or raise --nodes")
    graph, sample, replaying = _graph(args, trainer)
    for b, item in enumerate(items):
        counters = {part: counter() for part in PARTS}
        with counters["sample"]:
            replaying["sample"].append(counters["sample"])
            seed_gid, target = trainer.task.batch(item, training=True)
            batch = sample(seed_gid)
            if graph is not None:
                batch = graph.pad(batch, target)
        with counters["gather"]:
            x = trainer.loader.gather_rows(batch.n_id)
        with counters["step"]:
            replaying["step"].append(counters["step"])
            if graph is not None:
                _graphed_step(b, Prepared(batch, x, target), graph, trainer.task, sums, running, on_batch=None,
                              check_loss=guard, real=True)
            else:
                _train_step(b, Prepared(batch, x, target), train_module, trainer.optimizer, trainer.task, sums,
                            running, on_batch=None, check_loss=guard, after_step=None, real=True)
        if b >= args.warmup:
            for part in PARTS:
                totals[part].update(counters[part].ops)
    return totals


def _graph(args: argparse.Namespace, trainer: Any) -> tuple[Any, Any, dict[str, list[Any]]]:
    """With ``--cuda-graph step`` or ``auto``: the trainer's graphed step, and with ``auto`` its graphed sampling
    too, whose replays count as one launch each (``graph_replay``; their ops run uncounted, as a captured graph's
    kernels launch from the device); the batches' ``Sample``; and per part the list of its counters, the last of
    which is the one a replay counts in."""
    replaying: dict[str, list[Any]] = {"sample": [], "step": []}
    if args.cuda_graph == "off":
        return None, trainer.loader.sample, replaying
    from torch.utils._python_dispatch import _disable_current_modes

    from stages.runtime.sampling.static_shape import StaticShape
    from stages.train.rank import graphed

    def counted(part: str) -> Any:
        class CountedReplay:
            def __init__(self, fn: Any, generator: Any = None) -> None:
                self.fn = fn

            def replay(self) -> Any:
                replaying[part][-1].ops["graph_replay"] += 1
                with _disable_current_modes():
                    return self.fn()
        return CountedReplay
    trainer.not_graphed = None   # as on a lone CUDA rank with cuda_graph=step or auto
    shape = StaticShape.bound(args.batch_size, trainer.fanouts, args.nodes)
    step = graphed.GraphedStep(trainer.model, trainer.optimizer, trainer.task, shape, trainer.device,
                               capture=counted("step"))
    if args.cuda_graph == "step":
        return step, trainer.loader.sample, replaying
    from stages.runtime.sampling.static_sampler import StaticSampler
    from stages.train.rank.graphed_sampling import SampleGraph

    sampling = SampleGraph(StaticSampler(trainer.data.csr, list(trainer.fanouts), shape, generator=trainer.rng.sampler),
                           capture=counted("sample"))
    sampling.prepare()
    return step, sampling, replaying


def _guard(trainer: Any) -> Any:
    """The train stage's loss check of this tree: ``LossGuard`` (read one batch late) or the older ``loss_check``."""
    from stages.train.rank import guard

    if hasattr(guard, "LossGuard"):
        return guard.LossGuard(trainer.rank, trainer.world, 0)
    return guard.loss_check(trainer.rank, trainer.world, 0)  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=5, help="counted batches, after --warmup")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--ways", choices=("gpu", "cpu"), default="gpu", help="the code paths of a GPU, or a CPU's own")
    ap.add_argument("--cache", choices=("all", "none"), default="all",
                    help="rows cached: all (a lone GPU's default at products scale) or none (the store's path)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cuda-graph", choices=("off", "step", "auto"), default="off",
                    help="step: the training step as a captured CUDA graph on padded batches; auto: the sampling "
                         "too, by the static sampler (cuda_graph=auto); a replay is 1 launch")
    ap.add_argument("--tree", help="count this checkout of the repository instead of the one holding this script")
    ap.add_argument("--out", help="append the JSON line here too")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else HERE.parent))
    result = count(args)
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
