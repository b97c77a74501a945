"""Where a data stage's parallel units run (docs/design.md, "Executors"): the ``executor`` runtime setting.

- ``local`` (the default): the units run one after the other in the stage's process.
- ``dask`` / ``dask:N``: a ``distributed.LocalCluster`` of N worker processes, one thread each (``dask``: one per
  usable CPU, and no more than a stage's units when it runs alone: a unit is single-threaded numpy and I/O, so more
  workers than CPUs only contend). Within a ``run_scope`` (a pipeline run) the first stage that needs it starts it
  and the next stages use it, until a stage without units (training) or the end of the run stops it: a start costs
  5-10 s and a fresh worker's first unit 13-27 s of imports on the 2-core machine, once a run instead of once a
  stage. A stage run alone (``gnnpipe stage``) starts and stops its own.
- ``tcp://host:port``: the Dask scheduler of a cluster someone else runs; its workers must import gnnpipe.

On Dask the cluster is prefect-dask's ``DaskTaskRunner``: inside a Prefect run (a stage task of the flow) every unit
is a Prefect task run on it, a child of the stage's task run; outside one (``flows.direct``, tests, benchmarks)
the same unit function is submitted to the runner's client as a plain Dask task, because a Prefect task with no
run starts a temporary server of its own in every worker (26 s on the 2-core machine, against 3 ms a plain task).
Units take and return small picklable values (URLs, manifests, per-part figures): the arrays stay in the store.
A Prefect task run reports to the run's API from the worker that runs it; when a worker cannot reach that API (the
temporary server ``gnnpipe run`` starts listens on this host's loopback; a worker on another host cannot reach it),
the units run as plain Dask tasks instead, and one warning says which worker and how to see them in Prefect (a
server every worker reaches, ``PREFECT_API_URL``): the stage's own task run is recorded either way.

Before any unit runs, every worker reads back a token file the stage wrote under the artifact root
(``storage.reach``); a worker that cannot is one ``InputError`` line naming it and the root. A run SIGKILLed during
that check leaves the file; ``gnnpipe clean`` removes it, ``gnnpipe status`` never shows it.

Faults (tests/test_executor_faults.py):

- **A worker dies under a unit** (killed, out of memory): Dask runs the unit again on another worker, up to
  ``distributed.scheduler.allowed-failures`` deaths per unit (3 by default). The new attempt rewrites its parts from
  scratch (a unit's writer opens each store with Zarr's mode "w", which first deletes what the dead attempt left:
  chunks, ``.partial`` files), so the build is byte-identical to one with no death. Past the limit, the stage fails
  in one ``InputError`` line naming the unit and nothing of the build is kept (the stage's work directory is
  removed, no manifest); a rerun builds it. Unit task runs have no Prefect ``retries``: a unit that raises fails
  the same way again (its input, the disk), and a lost worker is Dask's to handle, not the task's.
- **Any failure in ``map``** (a unit raising, the limit above, Ctrl-C, SIGTERM): the units not done are cancelled,
  so an external scheduler holds none of the run's tasks once the stage has failed. On the run's own cluster its
  workers are SIGKILLed first, before the stage removes its work directory: a running unit stops only with its
  process, and one left running would write into that directory again. Its workers ignore SIGINT (the terminal's
  Ctrl-C reaches the whole process group; the run's process alone handles it): measured on the loaded 2-core
  machine, Ctrl-C of ``gnnpipe run --set executor=dask:2`` during the features units exits in 2.5-3.3 s with the
  one ``interrupted`` line and no process left (the cluster is gone 0.12 s after the signal), against 2.2 s for
  ``local``; the rest is Prefect's and its temporary server's shutdown, as for ``local``.
- **An external cluster's running units cannot be stopped** (Dask does not interrupt a task in its thread): each
  finishes, and what it writes lands in the abandoned ``<stage>/.tmp-<key>-*`` work directory, never taken for a
  build; ``gnnpipe status`` lists it as being written or left by a killed run, and ``gnnpipe clean`` removes it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from stages.jobs.cluster import usable_cpus
from storage.errors import InputError
from storage.reach import reach_token, read_token
from storage.store import ArtifactStore

_log = logging.getLogger("gnnpipe.executor")
U = TypeVar("U")
R = TypeVar("R")

LOCAL = "local"
FORM = "local, dask, dask:N (N worker processes) or a Dask scheduler address tcp://host:port"
_DASK = re.compile(r"dask(?::(\d+))?")
_ADDRESS = re.compile(r"(tcp|tls)://[^\s/:]+:\d+")
# a scheduler that has no worker within this time fails the stage in one line instead of waiting forever
WORKER_WAIT_S = 60
# how long a nanny of the run's own cluster waits for its SIGKILLed worker process to be reaped before it kills it
# again (and logs it)
KILL_WAIT_S = 1.0


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


# what a unit's result may carry of its own cost and place, kept per unit in the stage's summary on Dask (a
# worker's peak memory is not the stage process's)
UNIT_FIGURES = ("host", "pid", "wall_s", "peak_anon_bytes", "start_anon_bytes", "base_anon_bytes")


def unit_record(parts: list[int], result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A unit's line in the summary's ``units``: its parts, ``extra``, and the ``UNIT_FIGURES`` it returned."""
    return {"parts": parts, **extra, **{k: result[k] for k in UNIT_FIGURES if k in result}}


class Executor:
    """Runs a list of units, ``fn(unit)`` each (``fn`` takes one parameter, a unit has a ``label`` naming it in
    Prefect's task runs); ``slots``: how many run at once (what a unit's share of the memory budget is)."""

    slots = 1

    def map(self, fn: Callable[[U], R], units: Sequence[U], *, name: str) -> list[R]:
        return [fn(unit) for unit in units]


class DaskExecutor(Executor):
    """Units on a Dask cluster; ``own``: the cluster is a LocalCluster this run started (its workers are ours to
    kill), not someone else's scheduler."""

    def __init__(self, runner: Any, slots: int, *, own: bool = False, task_runs: bool = True) -> None:
        self.runner, self.slots, self.own, self.task_runs = runner, slots, own, task_runs

    def map(self, fn: Callable[[U], R], units: Sequence[U], *, name: str) -> list[R]:
        from distributed import KilledWorker
        from prefect.cache_policies import NO_CACHE
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.tasks import Task

        futures: list[Any] = []
        try:
            if self.task_runs and (TaskRunContext.get() or FlowRunContext.get()):
                arg = next(iter(inspect.signature(fn).parameters))   # Prefect passes parameters by name
                # no Prefect retries: a unit that raises fails the same way again (its input, the disk), and a
                # worker that dies under a unit is Dask's to handle (the unit is rescheduled, see the module doc)
                unit_task = Task(fn, name=name, task_run_name=f"{name}-{{{arg}.label}}", cache_policy=NO_CACHE,
                                 persist_result=False)
                futures = [self.runner.submit(unit_task, parameters={arg: unit}) for unit in units]
                return [f.result() for f in futures]
            client = self.runner.client
            futures = [client.submit(fn, unit, pure=False) for unit in units]
            return list(client.gather(futures))
        except BaseException as err:   # a failed unit, a lost worker, Ctrl-C: no unit goes on writing
            try:
                self._abandon(futures)
            except Exception as cleanup:  # noqa: BLE001 - a cleanup error must not hide why the stage failed
                _log.warning("could not stop the units of %s: %s", name, cleanup)
            if isinstance(err, KilledWorker):
                raise InputError(_killed_message(err, futures, units, name)) from None
            raise

    def _abandon(self, futures: list[Any]) -> None:
        """Cancel the units not done, so that a scheduler holds none of them; on the run's own cluster also kill
        its workers now: a running unit stops only with its process, and the stage is about to remove the work
        directory it writes into (``ArtifactStore.writing``), which a unit left running would create again."""
        if self.own:   # first: a unit cancelled while it runs is one more warning from its worker
            _Scope.forget(self.runner)   # its workers are gone: a later stage of the run starts a new cluster
            with _quiet("distributed"):   # "Worker process still alive ..., killing", lost results: expected
                _kill_workers(self.runner.client.cluster)
        pending = [getattr(f, "wrapped_future", f) for f in futures]
        pending = [f for f in pending if not f.done()]
        if pending:
            self.runner.client.cancel(pending)


def _kill_workers(cluster: Any) -> None:
    """SIGKILL every worker process of ``cluster`` (a LocalCluster with nannies, on this host) and close their
    nannies. Not the nannies' own close alone: it asks a worker to stop, which cancels the running unit (one
    more warning on the terminal), and waits ``0.8 * timeout`` (4 s by default) for a busy worker before it kills
    it, for work that is thrown away."""
    import asyncio

    async def kill_all() -> None:
        nannies = list(cluster.workers.values())
        pids = [nanny.pid for nanny in nannies]
        closing = [asyncio.ensure_future(nanny.close(timeout=KILL_WAIT_S, reason="gnnpipe-abandon"))
                   for nanny in nannies]
        await asyncio.sleep(0)   # every nanny is closing now, so it restarts no worker that dies
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        await asyncio.gather(*closing, return_exceptions=True)

    cluster.sync(kill_all)


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger ``name`` shows errors only during the block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _killed_message(err: Any, futures: list[Any], units: Sequence[Any], name: str) -> str:
    """One line for a unit whose workers all died under it (``distributed.scheduler.allowed-failures`` + 1)."""
    keys = [getattr(getattr(f, "wrapped_future", f), "key", None) for f in futures]
    unit = units[keys.index(err.task)] if err.task in keys else None
    label = f"{name}-{unit.label}" if unit is not None and hasattr(unit, "label") else name
    deaths = err.allowed_failures + 1
    return (f"{deaths} Dask worker{'s' if deaths > 1 else ''} died running unit {label} (the last: "
            f"{err.last_worker.address}); nothing of this build was kept: rerun to continue (finished stages are "
            f"cached), and see that worker's log for why it died (out of memory?)")


@contextmanager
def open_executor(text: str, *, units: int, store: ArtifactStore) -> Iterator[Executor]:
    """The executor ``text`` names, ready for ``units`` units whose files go under ``store``'s root: a local
    cluster started (and stopped when the block ends, however it ends) or a scheduler connected, and every worker
    shown to reach the root."""
    spec = parse_executor(text)
    if spec.kind == "local":
        yield Executor()
        return
    scope = _Scope.current
    if spec.kind == "dask" and scope is not None:   # the run's cluster: started by the first stage that needs it
        runner = scope.runner(text, spec)
        yield _ready(runner, spec, units, store)
        return
    with _runner(spec, units) as runner:
        yield _ready(runner, spec, units, store)


def _ready(runner: Any, spec: ExecutorSpec, units: int, store: ArtifactStore) -> DaskExecutor:
    """The executor on ``runner``'s cluster once it has a worker, every worker reaches the root, and it is known
    whether the workers reach the Prefect API."""
    client = _connect(runner, spec)
    workers = _workers(client, spec)
    check_reach(client, store)
    return DaskExecutor(runner, slots=max(1, min(units, len(workers))), own=spec.kind == "dask",
                        task_runs=_api_reachable(client))


class _Scope:
    """The clusters of one run (``run_scope``): ``dask[:N]`` text -> its entered DaskTaskRunner."""

    current: _Scope | None = None

    def __init__(self) -> None:
        self.runners: dict[str, Any] = {}

    def runner(self, text: str, spec: ExecutorSpec) -> Any:
        if text not in self.runners:
            runner = _runner(spec, usable_cpus())
            runner.__enter__()
            self.runners[text] = runner
        return self.runners[text]

    def before_stage(self, params: Any) -> None:
        """Stop the clusters before a stage without units (its Params has no ``executor``): training's ranks need
        the memory and CPUs the idle workers hold."""
        if "executor" not in type(params).model_fields:
            self.close()

    def close(self) -> None:
        runners, self.runners = list(self.runners.values()), {}
        for runner in runners:
            runner.__exit__(None, None, None)

    @classmethod
    def forget(cls, runner: Any) -> None:
        """``runner``'s workers were killed (a failed stage): the run's next stage must not use it."""
        scope = cls.current
        if scope is not None:
            scope.runners = {t: r for t, r in scope.runners.items() if r is not runner}


@contextmanager
def run_scope() -> Iterator[Callable[[Any], None]]:
    """One ``dask[:N]`` cluster for every stage of a run inside the block (module docstring), stopped when the
    block ends however it ends; yields ``before_stage(params)``, called with each stage's Params before it runs,
    which stops the cluster before a stage without units."""
    scope, before = _Scope(), _Scope.current
    _Scope.current = scope
    try:
        yield scope.before_stage
    finally:
        _Scope.current = before
        scope.close()


def _api_reachable(client: Any) -> bool:
    """Whether every worker reaches the Prefect API this process reports to (True outside a Prefect run: no unit
    is a task run then); False with one warning naming the first worker that cannot."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url or not (TaskRunContext.get() or FlowRunContext.get()):
        return True
    answers: dict[str, str | None] = client.run(api_problem, str(url))
    for worker, problem in sorted(answers.items()):
        if problem is not None:
            _log.warning("Dask worker %s cannot reach the Prefect API at %s (%s): the units run as plain Dask "
                         "tasks, not Prefect task runs; to see them in Prefect, run a server every worker reaches "
                         "(prefect server start --host 0.0.0.0) and set PREFECT_API_URL to it", worker, url, problem)
            return False
    return True


def api_problem(url: str) -> str | None:
    """None if the Prefect API at ``url`` answers its health check from this process, else why not."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=5) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except Exception as err:  # noqa: BLE001 - any failure to connect is the answer
        return f"{type(err).__name__}: {err}"


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
                                          "silence_logs": logging.WARNING, "preload": [__name__]})


def dask_setup(worker: Any) -> None:
    """What each worker process of the run's own cluster does first (this module is its Dask preload; it runs in
    the worker's main thread).

    - Ignore SIGINT: a Ctrl-C reaches every process of the terminal's process group, the workers too, and each
      printed a KeyboardInterrupt traceback and died (and its nanny's close then waited 4 s); the run's process
      alone handles it, and kills them (``_kill_workers``).
    - No multiprocessing lock for tqdm (the stream's bars, off in a unit, still make one): a killed worker leaks
      its semaphore, and the resource tracker warned of it on the terminal after the run's last line.
    """
    from tqdm.std import TqdmDefaultWriteLock

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    TqdmDefaultWriteLock.mp_lock = None


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
