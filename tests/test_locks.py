"""Stage locks die with their holder (issue [1/5] item 1): ``flows.locks.StageLockManager``.

Before, Prefect's file lock (``{"holder": uuid, "expiration": null}``) outlived a SIGKILLed run and every later run
of that configuration waited on it forever, silently. Holders here are real processes: one that is killed, one that
lives and releases, two that queue.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import interrupts
from flows.holders import TTL_S, Holder
from flows.locks import StageBusyError, StageLockManager, remove_stale, tidy
from flows.records import locks_dir, task_key
from tests.conftest import REPO, cli_env

KEY = "train-0123456789abcdef-outcome1"

# A holder in a process of its own: takes the lock, says so, holds it (seconds, or until a line on stdin), says it
# releases it, releases it.
HOLD = r"""
import sys, time
from pathlib import Path
from flows.locks import StageLockManager
m = StageLockManager(Path(sys.argv[1]))
assert m.acquire_lock(sys.argv[2], sys.argv[3])
print("held", time.time(), flush=True)
sys.stdin.readline() if sys.argv[4] == "stdin" else time.sleep(float(sys.argv[4]))
print("releasing", time.time(), flush=True)
m.release_lock(sys.argv[2], sys.argv[3])
"""


def _holder(directory: Path, holder: str, hold: float | str, origin: str = "gnnpipe run --set epochs=300",
            wait_held: bool = True) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), KEY, holder, str(hold)], cwd=REPO,
                            env={**cli_env(), "GNNPIPE_ORIGIN": origin}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if not wait_held:
        return proc
    line = proc.stdout.readline()
    assert line.startswith("held"), (line, proc.stderr.read() if proc.stderr else "")
    return proc


def test_a_lock_of_a_sigkilled_run_is_taken_over_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    victim = _holder(tmp_path, "victim", 600)
    record = json.loads((tmp_path / f"{KEY}.lock").read_text())
    assert record["pid"] == victim.pid and record["command"] == "gnnpipe run --set epochs=300"
    victim.kill()   # what the OOM killer does: no cleanup runs
    victim.wait()
    manager = StageLockManager(tmp_path, wait=False)   # at once: it would raise if it thought the holder alive
    assert manager.acquire_lock(KEY, "next")
    said = capsys.readouterr().err
    assert f"train: took over the lock of pid {victim.pid} on host {socket.gethostname()}" in said
    assert "gnnpipe run --set epochs=300" in said and "died without releasing it" in said
    assert json.loads((tmp_path / f"{KEY}.lock").read_text())["pid"] == os.getpid()
    manager.release_lock(KEY, "next")
    assert not (tmp_path / f"{KEY}.lock").exists()


def test_a_lock_left_by_prefects_own_manager_is_taken_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The file an older gnnpipe left (the issue's reproduction): it names no process, so nobody holds it."""
    (tmp_path / f"{KEY}.lock").write_text('{"holder":"a36cddd0-3f34-41e2-9d6f-6a03c6330b37","expiration":null}')
    assert StageLockManager(tmp_path, wait=False).acquire_lock(KEY, "next")
    assert "written by an older gnnpipe" in capsys.readouterr().err


def _record(**changes: object) -> dict[str, object]:
    return {"holder": "other", **{**Holder.current().record(), **changes}}


def test_liveness_on_this_host_is_pid_and_start_time_and_elsewhere_the_heartbeat(tmp_path: Path):
    me = Holder.current()
    assert me.alive()
    assert not Holder.from_record(_record(started=me.started - 5)).alive()   # pid reused by another process
    assert not Holder.from_record(_record(boot_id="an-earlier-boot")).alive()   # same host, before a reboot
    elsewhere = {"host": "node-b", "pid": 1}
    assert Holder.from_record(_record(**elsewhere, renewed=time.time())).alive()
    assert not Holder.from_record(_record(**elsewhere, renewed=time.time() - TTL_S - 1)).alive()
    manager = StageLockManager(tmp_path, wait=False)
    (tmp_path / f"{KEY}.lock").write_text(json.dumps(_record(**elsewhere, renewed=time.time())))
    with pytest.raises(StageBusyError, match="pid 1 on host node-b"):
        manager.acquire_lock(KEY, "mine")
    (tmp_path / f"{KEY}.lock").write_text(json.dumps(_record(**elsewhere, renewed=time.time() - TTL_S - 1)))
    assert manager.acquire_lock(KEY, "mine")


def test_the_heartbeat_renews_a_held_lock(tmp_path: Path):
    manager = StageLockManager(tmp_path)
    assert manager.acquire_lock(KEY, "mine")
    before = json.loads((tmp_path / f"{KEY}.lock").read_text())["renewed"]
    time.sleep(0.01)
    assert manager.renew(KEY, "mine")
    assert json.loads((tmp_path / f"{KEY}.lock").read_text())["renewed"] > before
    assert not manager.renew(KEY, "someone else")
    manager.release_lock(KEY, "mine")


def test_a_live_holder_is_named_and_waited_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    live = _holder(tmp_path, "live", 3)
    try:
        with pytest.raises(StageBusyError) as busy:
            StageLockManager(tmp_path, wait=False).acquire_lock(KEY, "next")
        assert f"train is being built by another run: pid {live.pid} on host {socket.gethostname()}" in str(busy.value)
        assert "gnnpipe run --set epochs=300" in str(busy.value) and "since " in str(busy.value)
        assert "without --no-wait" in str(busy.value)
        manager = StageLockManager(tmp_path)
        assert not manager.acquire_lock(KEY, "next", acquire_timeout=0.5)   # still held: gave up after 0.5 s
        said = capsys.readouterr().err
        assert f"train: waiting for another run that is building it: pid {live.pid}" in said, said
        assert manager.acquire_lock(KEY, "next")   # waits until the holder releases it
        assert live.wait(timeout=10) == 0
    finally:
        live.kill()
    manager.release_lock(KEY, "next")


def test_two_live_runs_serialise(tmp_path: Path):
    first = _holder(tmp_path, "first", "stdin")
    second = _holder(tmp_path, "second", 0, wait_held=False)
    assert second.stderr is not None and first.stdin is not None
    said = second.stderr.readline()   # it waits, saying for whom ...
    assert f"waiting for another run that is building it: pid {first.pid}" in said, said
    first.stdin.write("release\n")
    first.stdin.flush()
    out_first, _ = first.communicate(timeout=30)
    out_second, _ = second.communicate(timeout=30)   # ... and takes the lock once the first released it
    released = float(next(ln for ln in out_first.splitlines() if ln.startswith("releasing")).split()[1])
    taken = float(out_second.split()[1])
    assert first.returncode == second.returncode == 0 and taken >= released, (out_first, out_second)


# Waits for a lock a live process holds, under gnnpipe's signal handling; prints the CLI's line when interrupted.
WAIT = r"""
import sys
from pathlib import Path
from flows import interrupts
from flows.locks import StageLockManager
interrupts.install()
try:
    StageLockManager(Path(sys.argv[1])).acquire_lock(sys.argv[2], "waiter")
except interrupts.Interrupted as exc:
    print(interrupts.message(exc, interrupts.interrupted_stage(exc)), flush=True)
    sys.exit(exc.exit_code)
"""


def test_a_run_stopped_while_waiting_says_what_it_waited_for(tmp_path: Path):
    live = _holder(tmp_path, "live", 600)
    try:
        waiter = subprocess.Popen([sys.executable, "-c", WAIT, str(tmp_path), KEY], cwd=REPO, env=cli_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiter.stderr is not None
        assert "waiting for another run" in waiter.stderr.readline()
        waiter.send_signal(signal.SIGTERM)
        out, _ = waiter.communicate(timeout=30)
    finally:
        live.kill()
    assert waiter.returncode == 143
    assert out.strip().startswith("interrupted by SIGTERM while waiting for stage train, which another run is "
                                  f"building (pid {live.pid} on host"), out
    assert "no stage was running" not in out


def test_message_when_no_stage_ran_and_none_was_waited_for():
    assert "no stage was running" in interrupts.message(interrupts.Interrupted(signal.SIGINT), None)


def test_clean_removes_stale_locks_and_keeps_live_ones(tmp_path: Path):
    live = _holder(tmp_path, "live", 600)
    try:
        (tmp_path / "train-dead-outcome1.lock").write_text(json.dumps(_record(pid=live.pid, started=1.0)))
        (tmp_path / "train-old-outcome1.lock").write_text('{"holder": "x", "expiration": null}')
        (tmp_path / "hotness-dead-outcome1.lock").write_text('{"holder": "x", "expiration": null}')
        removed, kept = remove_stale(tmp_path, "train")
        assert removed == 2 and [(p.name, h.pid) for p, h in kept] == [(f"{KEY}.lock", live.pid)]
        assert sorted(p.name for p in tmp_path.glob("*.lock")) == ["hotness-dead-outcome1.lock", f"{KEY}.lock"]
    finally:
        live.kill()


def test_tidy_removes_leftovers_only_when_nobody_builds_the_key(tmp_path: Path):
    root = str(tmp_path / "art")
    checkpoints = tmp_path / "art" / ".checkpoints" / "train-0123456789abcdef"
    work = tmp_path / "art" / "train" / ".tmp-0123456789abcdef-1a2b3c4d"
    for path in (checkpoints, work):
        path.mkdir(parents=True)
    manager = StageLockManager(locks_dir(root))
    assert manager.acquire_lock(task_key("train", "0123456789abcdef"), "a forced rebuild")
    assert tidy(root, "train", "0123456789abcdef") == []   # a live run builds it: its checkpoints stay
    assert checkpoints.is_dir() and work.is_dir()
    manager.release_lock(task_key("train", "0123456789abcdef"), "a forced rebuild")
    assert sorted(tidy(root, "train", "0123456789abcdef")) == sorted([work, checkpoints])
    assert not checkpoints.exists() and not work.exists()


@pytest.mark.slow
def test_no_wait_fails_at_once_naming_the_live_run(prefect_server: str, tiny: dict[str, object]):
    """``gnnpipe run --no-wait`` while a live process (this test's) holds the download stage's lock."""
    from flows.config import make_config, stage_keys
    from tests.conftest import GNNPIPE

    cfg = make_config({k: v for k, v in tiny.items()})
    key = task_key("download", stage_keys(cfg)["download"])
    manager = StageLockManager(locks_dir(cfg.artifacts))
    assert manager.acquire_lock(key, "this test")
    try:
        args = [a for k, v in tiny.items() if k != "artifacts" for a in ("--set", f"{k}={v}")]
        proc = subprocess.run([*GNNPIPE, "run", "--no-wait", "--artifacts", cfg.artifacts, *args], cwd=REPO,
                              env=cli_env(prefect_server), capture_output=True, text=True, timeout=300)
    finally:
        manager.release_lock(key, "this test")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: download is being built by another run: pid {os.getpid()} on host "), last
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (Path(cfg.artifacts) / "download").exists()
