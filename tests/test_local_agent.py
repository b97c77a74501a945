"""The single-host agent (``stages.jobs.local_agent``) under the real launcher: the ranks get torchrun's environment
and join through its file store; a failed or stubborn rank stops the job and is named; a signal from outside is
named as such. The rank program is ``tests._agent_rank``."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from stages.jobs.cluster import Cluster
from stages.jobs.errors import TrainingError
from stages.jobs.launcher import LOCAL_AGENT, TORCHRUN, job_command, launch
from stages.jobs.local_agent import SCRIPT


def _launch(tmp_path: Path, mode: str, lines: list[str], grace_s: float = 10) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"mode": mode, "result_dir": str(tmp_path)}))
    launch(str(spec), 2, result_dir=str(tmp_path), log=lines.append, timeout_s=120, grace_s=grace_s,
           module="tests._agent_rank")


def _rank_pids(lines: list[str]) -> dict[int, int]:
    return {int(m.group(1)): int(m.group(2)) for line in lines if (m := re.match(r"\[rank (\d)\] pid (\d+) ready",
                                                                                   line))}


def _gone(pids: list[int]) -> bool:
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=5)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_one_host_runs_the_agent_and_several_run_torchrun():
    local = job_command("/tmp/spec.json", 4)
    assert local.agent == LOCAL_AGENT and local.argv[1:5] == ["-I", "-S", SCRIPT, "4"]
    rank_argv = local.argv[local.argv.index("--") + 1:]
    assert rank_argv[1:] == ["-m", "stages.train.rank.worker", "--spec", "/tmp/spec.json"]
    multi = job_command("/tmp/spec.json", 4, Cluster(nnodes=2, rdzv_endpoint="10.0.0.1:29400"))
    assert multi.agent == TORCHRUN and multi.argv[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc_per_node=2" in multi.argv


def test_ranks_get_torchruns_environment_and_join_through_the_agents_store(tmp_path: Path):
    lines: list[str] = []
    _launch(tmp_path, "env", lines)
    records = [json.loads((tmp_path / f"env-{r}.json").read_text()) for r in range(2)]
    for rank, record in enumerate(records):
        assert (record["RANK"], record["LOCAL_RANK"], record["GROUP_RANK"]) == (str(rank), str(rank), "0")
        assert (record["WORLD_SIZE"], record["LOCAL_WORLD_SIZE"]) == ("2", "2")
        assert record["GNNPIPE_INIT_METHOD"].endswith(f"/store?rank={rank}&world_size=2")
        assert record["sum"] == 1.0   # 0 + 1, all-reduced over the gloo group the file store joined
    store_dir = Path(records[0]["GNNPIPE_INIT_METHOD"].removeprefix("file://")).parent
    assert not store_dir.exists(), "the agent removes its store"
    assert any(line.startswith("[launcher] pid ") and SCRIPT in line for line in lines), lines[:3]


def test_a_rank_killed_stops_its_peer_at_once_and_is_named(tmp_path: Path):
    lines: list[str] = []
    start = time.monotonic()
    with pytest.raises(TrainingError, match=r"^training failed: rank 1 was killed by SIGKILL; the job was stopped"):
        _launch(tmp_path, "die", lines)
    assert time.monotonic() - start < 30, "rank 0 (asleep for 600 s) must be stopped, not waited for"
    pids = _rank_pids(lines)
    assert _gone(list(pids.values()))
    assert f"[agent] rank 1 exited with code -9 (pid {pids[1]}), the first failure" in lines
    assert f"[agent] rank 0 exited with code -15 (pid {pids[0]})" in lines


def test_a_rank_deaf_to_sigterm_is_killed_after_the_grace(tmp_path: Path):
    lines: list[str] = []
    with pytest.raises(TrainingError, match=r"^training failed: rank 1 exited with code 3"):
        _launch(tmp_path, "stubborn", lines, grace_s=1)
    pids = _rank_pids(lines)
    assert _gone(list(pids.values()))
    assert f"[agent] rank 0 exited with code -9 (pid {pids[0]})" in lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_agent_signalled_from_outside_stops_its_ranks_and_says_so(tmp_path: Path, sig: signal.Signals):
    lines: list[str] = []

    def signal_the_agent() -> None:
        deadline = time.monotonic() + 60
        while len(_rank_pids(lines)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(psutil.Process(_rank_pids(lines)[0]).ppid(), sig)   # a scheduler's or `kill`'s signal

    watcher = threading.Thread(target=signal_the_agent, daemon=True)
    watcher.start()
    with pytest.raises(TrainingError) as err:
        _launch(tmp_path, "wait", lines)
    watcher.join(5)
    assert str(err.value).startswith(f"training was stopped by a signal: the job's agent received {sig.name} from "
                                     f"outside gnnpipe"), str(err.value)
    assert f"[agent] received {sig.name}, stopping the ranks" in lines
    assert _gone(list(_rank_pids(lines).values()))
