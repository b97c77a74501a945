"""What the training benchmarks share: the real stages up to hotness into ``args.root`` (cached there;
bench_train, bench_prefetch and bench_infer build through ``upstream_values``), and the DDP benchmarks' ranks
(bench_train, bench_prefetch) launched as the train stage launches its own, with the spec the train worker reads.
Each of those ``--rank-worker``s writes ``bench.json`` into the spec's result directory; what it wrote before the
ranks failed or were stopped still comes out (``dist_result``)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from _graph_args import download_params

RUNTIME = "runtime"   # the cache policy that is the train stage's own cache, as the ranks build it


def run_rank_worker(spec_path: str, body: Callable[[], None]) -> NoReturn:
    """A benchmark rank's ``body`` run as the train worker runs its own (``stages.runtime.rank_process.run_rank``):
    a user's error (a CUDA graph capture CUDA rejected, say) is one ``error:`` line and the launcher's error file
    (exit 2), any other exception a traceback (exit 1); then ``os._exit`` whatever happens, since tearing down
    torch.distributed at interpreter exit was seen to deadlock (``stages.train.rank.worker``)."""
    import os

    from stages.runtime.rank_process import rank_env, run_rank
    from stages.train.rank.guard import PeerStoppedError

    code = 1
    try:
        code = run_rank(spec_path, rank_env(), body, refused=lambda err: None, quiet=(PeerStoppedError,))
    finally:   # even where run_rank itself failed (its log prefix, say): never the interpreter's teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def upstream_values(args: argparse.Namespace, parts: int, *, feature_dtype: str = "auto",
                    cache_ratio: float = 0.2) -> dict[str, Any]:
    """The pipeline values of download → partition (``parts``) → features → hotness for ``args``' graph, fanouts and
    batch size: the training benchmarks build through them, so those with the same graph and settings share one build
    (``make gpu-check`` prepares it once for its train, prefetch and infer steps)."""
    return {**{f"download.{k}": v for k, v in download_params(args).items()}, "artifacts": args.root,
            "num_partitions": parts, "features.dtype": feature_dtype, "fanouts": list(args.fanouts),
            "batch_size": args.batch_size, "cache_ratio": cache_ratio, "until": "hotness"}


def build_upstream(values: dict[str, Any]) -> dict[str, Any]:
    """The stages of ``values`` (``upstream_values``) run, cached in their artifact root: every manifest by stage
    name."""
    from flows.direct import run_stages

    _, manifests = run_stages(values)
    return manifests


class RanksFailedError(Exception):
    """The ranks failed after rank 0 wrote ``bench.json``: what it wrote is in ``written``."""

    def __init__(self, message: str, written: dict[str, Any]) -> None:
        super().__init__(message)
        self.written = written


def run_ranks(script: str, args: argparse.Namespace, manifests: dict[str, Any], params: Any, ranks: int,
              worker_argv: list[str]) -> dict[str, Any]:
    """``script --rank-worker --spec SPEC *worker_argv`` on ``ranks`` torchrun ranks of train ``params``; returns
    the ``bench.json`` its rank 0 wrote; ``RanksFailedError`` where they failed after it wrote one."""
    from stages.jobs.errors import JobError
    from stages.jobs.launcher import launch
    from stages.train.spec import TrainSpec
    from storage.errors import GnnpipeError
    from storage.train import torchrun_log_dir

    with tempfile.TemporaryDirectory() as tmp:
        spec_path = str(Path(tmp, "spec.json"))
        TrainSpec(artifacts=args.root, key="bench", partition_key=manifests["partition"].key,
                  features_key=manifests["features"].key, hotness_key=manifests["hotness"].key,
                  params=params.model_dump(mode="json"), checkpoint_dir=tmp, result_dir=tmp).save(spec_path)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "--max-restarts=0", f"--log-dir={torchrun_log_dir(tmp)}", str(Path(script).resolve()),
               "--rank-worker", "--spec", spec_path, *worker_argv]
        written = Path(tmp, "bench.json")
        try:
            launch(spec_path, ranks, result_dir=tmp, log=lambda line: print(line, file=sys.stderr),
                   timeout_s=args.timeout_s, env={"OMP_NUM_THREADS": str(args.threads_per_rank)}, command=cmd)
        # GnnpipeError: a rank's one-line user error (a capture CUDA rejected: run_rank_worker), as launch repeats it;
        # KeyboardInterrupt: gpu_check's SIGINT at a step's limit
        except (JobError, GnnpipeError, KeyboardInterrupt) as error:
            if written.exists():
                said = str(error).splitlines()[0] if str(error) else "stopped (SIGINT)"
                raise RanksFailedError(said, json.loads(written.read_text())) from error
            raise
        return json.loads(written.read_text())


def dist_result(result: dict[str, Any], run: Callable[[], dict[str, Any]]) -> None:
    """``result["dist"] = run()``; where the ranks failed after rank 0 wrote ``bench.json``, what it wrote with the
    failure (``dist.failed``) is printed as the run's JSON line and the benchmark exits 1 (``make gpu-check`` keeps
    a failed step's last JSON line)."""
    try:
        result["dist"] = run()
    except RanksFailedError as failure:
        result["dist"] = {**failure.written, "failed": str(failure)}
        print(json.dumps(result), flush=True)
        sys.exit(1)
