"""A run killed outright (SIGKILL: the OOM killer, ``kill -9``) never blocks the next one (issue [1/5] item 1).

The reproduction of the issue, at every stage: ``gnnpipe run`` is SIGKILLed while it holds a stage's lock, and the
same command run again takes the lock over at once (naming the dead run), marks the dead run's flow run Crashed,
removes what the killed attempt left (a work directory, infer's job directory), and goes on to the next stage, where
it is killed in turn; the last run completes. Before, the second run waited on the first one's lock forever.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from flows.config import ORDER
from tests._cli_runs import GnnpipeRun
from tests.conftest import TINY

pytestmark = pytest.mark.slow


def _kill_while_holding(run: GnnpipeRun, locks: Path, stage: str, started: str | None = None,
                        timeout_s: float = 300.0) -> list[psutil.Process]:
    """SIGKILL gnnpipe (its process alone, as the OOM killer does) the moment it holds ``stage``'s lock (and a file
    matching the glob ``started`` exists); returns the processes it had started."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = started is None or next(Path("/").glob(started.lstrip("/")), None) is not None
        for path in locks.glob(f"{stage}-*.lock") if ready else []:
            try:
                held_by_run = json.loads(path.read_text()).get("pid") == run.proc.pid
            except (OSError, ValueError):
                continue
            if held_by_run:
                children = psutil.Process(run.proc.pid).children(recursive=True)
                os.kill(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
                return children
        assert run.proc.poll() is None, f"gnnpipe ended before {stage}:\n{''.join(run.lines)[-3000:]}"
        assert time.monotonic() < deadline, f"{stage} never locked:\n{''.join(run.lines)[-3000:]}"
        time.sleep(0.002)


def _flow_run(run: GnnpipeRun) -> str:
    text = "".join(run.lines)
    found = re.search(r"Beginning flow run '([^']+)'", text)
    assert found, text[-3000:]
    return found.group(1)


def test_sigkill_at_every_stage_then_the_same_command_finishes(prefect_server: str, tmp_path: Path):
    values = {**TINY, "fanouts": [5, 5], "batch_size": 64, "hidden": 16, "epochs": 3}
    args = [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    root = tmp_path / "art"
    args += ["--artifacts", str(root)]
    locks = root / ".prefect" / "locks"
    killed: list[tuple[str, int, str]] = []   # (stage, pid, flow run)
    for stage in ORDER:
        run = GnnpipeRun(args, api_url=prefect_server)
        # infer: once its job has started, so that the killed job's directory is left to remove
        children = _kill_while_holding(run, locks, stage, f"{root}/.jobs/infer-*/spec.json" if stage == "infer"
                                       else None)
        run._reader.join(timeout=10)
        if killed:
            _assert_took_over(run, *killed[-1])
        killed.append((stage, run.proc.pid, _flow_run(run)))
        _, alive = psutil.wait_procs(children, timeout=30)   # the agent and the ranks follow their parent
        assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], alive
    final = GnnpipeRun(args, api_url=prefect_server)
    assert final.proc.wait(timeout=600) == 0, "".join(final.lines)[-3000:]
    final._reader.join(timeout=10)
    _assert_took_over(final, *killed[-1])
    assert "infer: removed" in "".join(final.lines)   # the killed infer job's directory
    assert not list(locks.glob("*.lock")), "a finished run leaves no lock"
    assert not (root / ".jobs").exists() or not list((root / ".jobs").iterdir())
    _assert_crashed(prefect_server, [name for _, _, name in killed])


def _assert_took_over(run: GnnpipeRun, stage: str, pid: int, flow_run: str) -> None:
    text = "".join(run.lines)
    assert f"{stage}: took over the lock of pid {pid} on host" in text, text[-3000:]
    assert f"marked 1 flow run(s) Crashed whose gnnpipe process had been killed: {flow_run}" in text, text[-3000:]


def _assert_crashed(api_url: str, names: list[str]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)))
        assert sorted(r.name for r in runs) == sorted(names)
        assert {r.name: r.state.type.value for r in runs if r.state} == {name: "CRASHED" for name in names}
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)))
        assert all(t.state is None or t.state.is_final() for t in tasks), [(t.name, t.state) for t in tasks]
