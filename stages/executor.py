"""Where a data stage's parallel units run (docs/design.md, "Executors"): the ``executor`` runtime setting.

- ``local`` (the default): the units run one after the other in the stage's process.
- ``dask`` / ``dask:N``: a ``distributed.LocalCluster`` of N worker processes, one thread each, that the stage
  starts and stops (``dask``: one worker per unit, at most one per usable CPU: a unit is single-threaded numpy and
  I/O, so more workers than CPUs only contend).
- ``tcp://host:port``: the Dask scheduler of a cluster someone else runs; its workers must import gnnpipe.

On Dask the cluster is prefect-dask's ``DaskTaskRunner``: inside a Prefect run (a stage task of the flow) every unit
is a Prefect task run on it, a child of the stage's task run; outside one (``flows.direct``, tests, benchmarks)
the same unit function is submitted to the runner's client as a plain Dask task, because a Prefect task with no
run starts a temporary server of its own in every worker (26 s on the 2-core machine, against 3 ms a plain task).
Units take and return small picklable values (URLs, manifests, per-part figures): the arrays stay in the store.

Before any unit runs, every worker reads back a token file the stage wrote under the artifact root
(``storage.reach``); a worker that cannot is one ``InputError`` line naming it and the root.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from stages.train.cluster import usable_cpus
from storage.errors import InputError
from storage.reach import reach_token, read_token
from storage.store import ArtifactStore

U = TypeVar("U")
R = TypeVar("R")

LOCAL = "local"
FORM = "local, dask, dask:N (N worker processes) or a Dask scheduler address tcp://host:port"
_DASK = re.compile(r"dask(?::(\d+))?")
_ADDRESS = re.compile(r"(tcp|tls)://[^\s/:]+:\d+")
# a scheduler that has no worker within this time fails the stage in one line instead of waiting forever
WORKER_WAIT_S = 60


@dataclass(frozen=True)
class ExecutorSpec:
    """A parsed ``executor`` value."""

    kind: Literal["local", "dask", "address"]
    workers: int | None = None   # dask:N; None: one per unit, at most the usable CPUs
    address: str | None = None


def parse_executor(text: str) -> ExecutorSpec:
    """``local``, ``dask``, ``dask:N`` or ``tcp://host:port``; a ValueError naming the expected form otherwise."""
    value = text.strip()
    if value == LOCAL:
        return ExecutorSpec("local")
    if match := _DASK.fullmatch(value):
        workers = int(match.group(1)) if match.group(1) else None
        if workers == 0:
            raise ValueError("dask:N needs N >= 1 worker")
        return ExecutorSpec("dask", workers=workers)
    if _ADDRESS.fullmatch(value):
        return ExecutorSpec("address", address=value)
    raise ValueError(f"unknown executor {text!r}")


def check_executor(text: str) -> str:
    """The Params validator: ``text`` stripped, if it parses."""
    parse_executor(text)
    return text.strip()


def part_groups(num_parts: int, slots: int) -> list[tuple[int, ...]]:
    """Parts in ``slots`` contiguous groups of near-equal count (the partitioner balances their sizes): the units
    of a stage whose unit reads a whole-graph input once (x, the CSR), so one unit per worker slot."""
    return [tuple(int(p) for p in g) for g in np.array_split(np.arange(num_parts), min(slots, num_parts))]


class Executor:
    """Runs a list of units, ``fn(unit)`` each (``fn`` takes one parameter, a unit has a ``label`` naming it in
    Prefect's task runs); ``slots``: how many run at once (what a unit's share of the memory budget is)."""

    slots = 1

    def map(self, fn: Callable[[U], R], units: Sequence[U], *, name: str) -> list[R]:
        return [fn(unit) for unit in units]


class DaskExecutor(Executor):
    def __init__(self, runner: Any, slots: int) -> None:
        self.runner, self.slots = runner, slots

    def map(self, fn: Callable[[U], R], units: Sequence[U], *, name: str) -> list[R]:
        from prefect.cache_policies import NO_CACHE
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.tasks import Task

        futures: list[Any] = []
        try:
            if TaskRunContext.get() or FlowRunContext.get():
                arg = next(iter(inspect.signature(fn).parameters))   # Prefect passes parameters by name
                unit_task = Task(fn, name=name, task_run_name=f"{name}-{{{arg}.label}}", cache_policy=NO_CACHE,
                                 persist_result=False)
                futures = [self.runner.submit(unit_task, parameters={arg: unit}) for unit in units]
                return [f.result() for f in futures]
            client = self.runner.client
            futures = [client.submit(fn, unit, pure=False) for unit in units]
            return list(client.gather(futures))
        finally:   # a failed unit or Ctrl-C: the others stop now, not when the cluster does
            self._cancel(futures)

    def _cancel(self, futures: list[Any]) -> None:
        pending = [getattr(f, "wrapped_future", f) for f in futures]
        pending = [f for f in pending if not f.done()]
        if pending:
            self.runner.client.cancel(pending)


@contextmanager
def open_executor(text: str, *, units: int, store: ArtifactStore) -> Iterator[Executor]:
    """The executor ``text`` names, ready for ``units`` units whose files go under ``store``'s root: a local
    cluster started (and stopped when the block ends, however it ends) or a scheduler connected, and every worker
    shown to reach the root."""
    spec = parse_executor(text)
    if spec.kind == "local":
        yield Executor()
        return
    runner = _runner(spec, units)
    with runner:
        client = _connect(runner, spec)
        workers = _workers(client, spec)
        check_reach(client, store)
        yield DaskExecutor(runner, slots=max(1, min(units, len(workers))))


def _runner(spec: ExecutorSpec, units: int) -> Any:
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise InputError("executor=dask needs prefect-dask (pip install prefect-dask), or use executor=local"
                         ) from None
    if spec.address is not None:
        return DaskTaskRunner(address=spec.address)
    workers = spec.workers or max(1, min(units, usable_cpus()))
    # processes, not threads: a unit holds the GIL in numpy copies and codecs. No memory_limit: the stage bounds
    # each unit by its share of memory_budget_bytes itself, and Dask's nanny would kill a worker at 95 % of a
    # limit, which the stage would see as a lost worker instead of one line about the budget. No dashboard: a
    # fixed port collides between concurrent runs.
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": workers, "processes": True, "threads_per_worker": 1,
                                          "memory_limit": 0, "dashboard_address": None,
                                          "silence_logs": logging.WARNING})


def _connect(runner: Any, spec: ExecutorSpec) -> Any:
    try:
        return runner.client   # the cluster starts (or the scheduler is connected) here
    except OSError as err:
        where = f"the Dask scheduler at {spec.address}" if spec.address else "a local Dask cluster"
        raise InputError(f"cannot reach {where} ({err}); check executor=") from None


def _workers(client: Any, spec: ExecutorSpec) -> dict[str, Any]:
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except TimeoutError:
        raise InputError(f"the Dask scheduler at {spec.address} has no worker after {WORKER_WAIT_S} s; start "
                         f"workers (dask worker {spec.address}) or use executor=dask") from None
    workers: dict[str, Any] = client.scheduler_info(n_workers=-1)["workers"]
    return workers


def check_reach(client: Any, store: ArtifactStore) -> None:
    """Every worker of ``client`` reads the token file under ``store``'s root, else one InputError line naming the
    first worker that cannot and why."""
    with reach_token(store) as (url, token):
        answers: dict[str, str | None] = client.run(read_token, url, token)
    for worker, problem in sorted(answers.items()):
        if problem is not None:
            raise InputError(f"Dask worker {worker} cannot reach the artifact root {store.root} ({problem}); use "
                             f"a root every worker sees at the same address (a shared file system mounted at the "
                             f"same path, or an object store URL such as s3://...)")
