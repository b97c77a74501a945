"""What the DDP training benchmarks (bench_train, bench_prefetch) share: the real stages up to hotness into
``args.root`` (cached there), and their ranks launched as the train stage launches its own, with the spec the
train worker reads. Each benchmark's ``--rank-worker`` writes ``bench.json`` into the spec's result directory."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _graph_args import download_params

RUNTIME = "runtime"   # the cache policy that is the train stage's own cache, as the ranks build it


def build_upstream(args: argparse.Namespace, parts: int, *, feature_dtype: str = "auto",
                   cache_ratio: float = 0.2) -> dict[str, Any]:
    """download → partition (``parts``) → features → hotness for ``args``' graph, fanouts and batch size."""
    from stages.download import stage as download
    from stages.features import stage as features
    from stages.hotness import stage as hotness
    from stages.partition import stage as partition
    from storage import ArtifactStore

    store = ArtifactStore(args.root)
    dl = download.run(store, download.Params(**download_params(args)), {})
    pt = partition.run(store, partition.Params(num_partitions=parts), {"download": dl})
    ft = features.run(store, features.Params(dtype=feature_dtype), {"download": dl, "partition": pt})
    ht = hotness.run(store, hotness.Params(fanouts=tuple(args.fanouts), batch_size=args.batch_size,
                                           cache_ratio=cache_ratio), {"partition": pt, "features": ft})
    return {"download": dl, "partition": pt, "features": ft, "hotness": ht}


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

    with tempfile.TemporaryDirectory() as tmp:
        spec_path = str(Path(tmp, "spec.json"))
        TrainSpec(artifacts=args.root, key="bench", partition_key=manifests["partition"].key,
                  features_key=manifests["features"].key, hotness_key=manifests["hotness"].key,
                  params=params.model_dump(mode="json"), checkpoint_dir=tmp, result_dir=tmp).save(spec_path)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "--max-restarts=0", str(Path(script).resolve()), "--rank-worker", "--spec", spec_path, *worker_argv]
        written = Path(tmp, "bench.json")
        try:
            launch(spec_path, ranks, result_dir=tmp, log=lambda line: print(line, file=sys.stderr),
                   timeout_s=args.timeout_s, env={"OMP_NUM_THREADS": str(args.threads_per_rank)}, command=cmd)
        except JobError as error:
            if written.exists():
                raise RanksFailedError(str(error).splitlines()[0], json.loads(written.read_text())) from error
            raise
        return json.loads(written.read_text())
