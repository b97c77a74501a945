"""Per-unit overhead of ``stages.executor`` on a LocalCluster: a trivial unit (returns its label) mapped N times,
as plain Dask tasks (a stage called outside a Prefect run) and as Prefect task runs inside a flow (a temporary
Prefect server, as ``gnnpipe run`` starts). The cluster's start and stop are timed apart.

    python -m benchmarks.bench_executor --units 40 --workers 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from stages.executor import open_executor
from storage import ArtifactStore


@dataclass(frozen=True)
class Trivial:
    label: str


def trivial(unit: Trivial) -> str:
    return unit.label


def timed_map(executor: str, units: int, root: str) -> dict[str, float]:
    jobs = [Trivial(str(i)) for i in range(units)]
    t0 = time.perf_counter()
    with open_executor(executor, units=units, store=ArtifactStore(root)) as ex:
        t1 = time.perf_counter()
        ex.map(trivial, jobs[:2], name="warm")   # each worker imports the unit's module once
        t2 = time.perf_counter()
        assert ex.map(trivial, jobs, name="trivial") == [j.label for j in jobs]
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    return {"start_s": t1 - t0, "warm_s": t2 - t1, "per_unit_ms": 1000 * (t3 - t2) / units, "stop_s": t4 - t3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    executor = f"dask:{args.workers}"
    with tempfile.TemporaryDirectory() as root:
        print("plain dask  ", _fmt(timed_map(executor, args.units, root)))
        from prefect import flow
        from prefect.testing.utilities import prefect_test_harness

        @flow
        def in_flow() -> dict[str, float]:
            return timed_map(executor, args.units, root)

        with prefect_test_harness(server_startup_timeout=120):
            print("prefect task", _fmt(in_flow()))


def _fmt(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in figures.items())


if __name__ == "__main__":
    main()
