"""Flow runs whose process was killed outright are marked Crashed by the next run.

A run stopped by a signal it can handle (Ctrl-C, SIGTERM) has Prefect mark its flow run Crashed on the way out
(``flows.interrupts``). A SIGKILL (the OOM killer, ``kill -9``, a lost machine) leaves no way out: the flow run and
its running task stay "Running" in the UI forever. So each flow run leaves a record while it runs,
``$PREFECT_HOME/gnnpipe-runs/<flow run id>.json`` (who runs it: :class:`flows.holders.Holder`), removed when the
flow ends however it ends; the next flow run started from the same ``PREFECT_HOME`` finds the records whose process
is dead and sets their flow run and its unfinished task runs to Crashed, saying why.

The temporary server and ``gnnpipe server up`` both keep their database in ``PREFECT_HOME``, so the next run finds
the killed one there. A record whose flow run is not in the API this run talks to (a run recorded on another server)
is kept for :data:`FORGET_S`, then dropped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows import services
from flows.holders import Holder
from flows.locks import say

FORGET_S = 7 * 24 * 3600.0   # a week: long enough for a server that was down to come back


def runs_dir() -> Path:
    return services.home() / "gnnpipe-runs"


def _record_path(flow_run_id: str) -> Path:
    return runs_dir() / f"{flow_run_id}.json"


def _records() -> Iterator[tuple[Path, dict[str, Any]]]:
    base = runs_dir()
    if not base.is_dir():
        return
    for path in sorted(base.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue   # being written by a run starting now: the next run looks again
        if isinstance(data, dict):
            yield path, data


def _crash_message(holder: Holder, by: str) -> str:
    return (f"the gnnpipe process running this flow run ({holder.describe()}) died without a word: SIGKILL, the "
            f"OOM killer or a lost machine; marked Crashed by flow run {by}")


def mark_dead_runs(client: Any, by: str) -> list[str]:
    """Set every recorded flow run whose process died to Crashed, with its unfinished task runs; returns the names
    of those marked. ``client``: a sync Prefect client; ``by``: the name of the run doing it."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    marked = []
    for path, data in _records():
        holder = Holder.from_record(data)
        if holder is None or not holder.on_this_host() or holder.alive():
            continue   # another host's run, or one still running
        run_id = str(data.get("flow_run_id"))
        try:
            run = client.read_flow_run(run_id)
        except (ObjectNotFound, ValueError):
            if time.time() - holder.renewed > FORGET_S:
                path.unlink(missing_ok=True)
            continue
        message = _crash_message(holder, by)
        for task_run in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))):
            if task_run.state is not None and not task_run.state.is_final():
                client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
        if run.state is not None and not run.state.is_final():
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
            marked.append(run.name)
        path.unlink(missing_ok=True)
    return marked


@contextmanager
def tracked_run() -> Iterator[None]:
    """Inside a flow run: mark the flow runs of dead processes Crashed, and record this one until it ends."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    run_id, name = str(flow_run.id), str(flow_run.name)
    try:
        with get_client(sync_client=True) as client:
            marked = mark_dead_runs(client, name)
        if marked:
            say(f"marked {len(marked)} flow run(s) Crashed whose gnnpipe process had been killed: {', '.join(marked)}")
    except Exception as err:  # noqa: BLE001 (bookkeeping of earlier runs must never stop this one)
        say(f"could not mark the flow runs of killed processes Crashed: {err}")
    path = _record_path(run_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"flow_run_id": run_id, "flow_run_name": name, **Holder.current().record()}))
        os.replace(tmp, path)
    except OSError:   # a full disk: the run goes on, only a later SIGKILL would go unmarked
        pass
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
