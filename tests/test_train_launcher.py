"""The launcher's teardown and error reporting, with stand-in jobs (no torch): fast and deterministic."""

from __future__ import annotations

import _thread
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import psutil
import pytest

from stages.jobs.errors import TrainingError
from stages.jobs.launcher import REPO, RankFailure, failure_message, launch, torchrun_command
from stages.jobs.lifeline import SCRIPT, supervised
from storage.errors import InputError

# A job whose child ignores SIGTERM (only SIGKILL ends it): prints both pids, then hangs like a stuck rank.
STUBBORN_JOB = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring', flush=True); "
    "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()   # the child ignores SIGTERM from here on
print(f"[rank 0] pids {os.getpid()} {child.pid}", flush=True)
print("job ready", flush=True)
time.sleep(600)
"""

def _alive(pid: int, marker: str = "time.sleep(600)") -> bool:
    """Whether the job's process ``pid`` still runs (a recycled pid running something else does not count)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and marker in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _states(pids: list[int]) -> dict[int, str]:
    """What each pid is now, for a failure message."""
    states = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            states[pid] = f"{proc.status()} {proc.cmdline()[:2]} ppid {proc.ppid()} pgid {os.getpgid(pid)}"
        except (psutil.Error, OSError) as err:
            states[pid] = repr(err)
    return states


def _job_pids(lines: list[str]) -> list[int]:
    for line in lines:
        if m := re.match(r"\[rank 0\] pids (\d+) (\d+)", line):
            return [int(m.group(1)), int(m.group(2))]
    raise AssertionError(f"the job never printed its pids: {lines}")


def _wait_for(lines: list[str], line: str, timeout_s: float = 60) -> None:
    """Until ``line`` is one of ``lines`` (whole: the launcher's own first line quotes the job's code)."""
    deadline = time.monotonic() + timeout_s
    while line not in lines:
        assert time.monotonic() < deadline, f"no {line!r} in {lines}"
        time.sleep(0.05)


def test_timeout_kills_the_whole_process_group(tmp_path: Path):
    lines: list[str] = []
    start = time.monotonic()
    with pytest.raises(TrainingError, match=r"timed out after 8 s") as err:
        launch("unused", 1, result_dir=str(tmp_path), log=lines.append, timeout_s=8, grace_s=1,
               command=[sys.executable, "-c", STUBBORN_JOB])
    assert "\n" not in str(err.value)
    assert time.monotonic() - start < 30
    pids = _job_pids(lines)
    assert not any(_alive(pid) for pid in pids), "the SIGTERM-proof child must be SIGKILLed too"
    assert any("SIGKILLed pids" in line for line in lines)
    assert any(line.startswith("[launcher] pid ") for line in lines)
    assert "[torchrun] job ready" in lines, "unprefixed lines are torchrun's"


@pytest.fixture
def sigint_raises():
    """Python leaves SIGINT ignored when started in the background by a non-interactive shell (as CI may be);
    interrupt_main() then does nothing. Install the default handler for the test, and restore what was there."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_kills_the_whole_process_group(tmp_path: Path, sigint_raises):
    lines: list[str] = []
    # interrupt once the job runs (a cancelled Prefect task or Ctrl-C lands in the same place)
    watcher = threading.Thread(target=lambda: (_wait_for(lines, "[torchrun] job ready"), _thread.interrupt_main()),
                               daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        launch("unused", 1, result_dir=str(tmp_path), log=lines.append, timeout_s=120, grace_s=1,
               command=[sys.executable, "-c", STUBBORN_JOB])
    watcher.join(5)
    pids = _job_pids(lines)
    assert not any(_alive(pid) for pid in pids), lines


def test_failed_job_without_a_rank_report(tmp_path: Path):
    lines: list[str] = []
    with pytest.raises(TrainingError, match="torchrun exited with code 3 before naming a rank"):
        launch("unused", 1, result_dir=str(tmp_path), log=lines.append, timeout_s=60,
               command=[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    assert "[torchrun] boom" in lines


def test_a_record_half_written_by_a_killed_rank_is_removed(tmp_path: Path):
    """A rank killed by the teardown between writing its error record's temporary and renaming it (the CI saw
    ``.error-1.json.tmp-<id>`` left after a file-size-limit failure): the launcher removes it once the job is gone,
    and nothing else."""
    partial, kept = tmp_path / ".error-1.json.tmp-3beaaa2e", tmp_path / "error-0.json"
    for path in (partial, kept):
        path.write_text("{")
    with pytest.raises(TrainingError):
        launch("unused", 1, result_dir=str(tmp_path), log=lambda line: None, timeout_s=60,
               command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    assert not partial.exists() and kept.exists()


def test_failure_message_names_the_rank_that_caused_it():
    rec0 = {0: {"rank": 0, "type": "RuntimeError", "user_error": False, "message": "Connection reset by peer"}}
    # rank 1 died by SIGKILL (no error record); rank 0's lost connection is a consequence
    err = failure_message([RankFailure(0, 1, False), RankFailure(1, -9, True)], rec0, 1)
    assert isinstance(err, TrainingError) and "rank 1 was killed by SIGKILL" in str(err)
    # rank 0 was stopped by torchrun's SIGTERM before it could write its record: still rank 1
    err = failure_message([RankFailure(0, -15, False), RankFailure(1, -9, True)], {}, 1)
    assert "rank 1 was killed by SIGKILL" in str(err)
    # a user error on rank 1 is repeated as such, whatever happened to the stopped peer
    user = {1: {"rank": 1, "type": "InputError", "user_error": True, "message": "world size 1 != 2 partitions"}}
    err = failure_message([RankFailure(1, 2, True), RankFailure(0, -15, False)], user, 1)
    assert isinstance(err, InputError) and str(err) == "rank 1: world size 1 != 2 partitions"
    err = failure_message([RankFailure(0, 1, True)], {0: {"rank": 0, "type": "ValueError", "user_error": False,
                                                          "message": "x"}}, 1)
    assert "rank 0 raised ValueError: x" in str(err)
    assert "rank 2 exited with code 7" in str(failure_message([RankFailure(2, 7, True)], {}, 1))
    gloo = ("[/x/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:42382. This is typically "
            "caused by a remote worker crashing.")
    err = failure_message([RankFailure(0, 1, True)], {0: {"rank": 0, "type": "RuntimeError", "user_error": False,
                                                          "message": gloo}}, 1)
    assert str(err).startswith("training failed: rank 0 lost its connection to [10.0.0.2]:42382, a rank on another "
                               "node died")


def test_torchrun_command_runs_one_rank_per_partition_without_restarts():
    cmd = torchrun_command("/tmp/spec.json", 4)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--nproc_per_node=4" in cmd and "--max-restarts=0" in cmd
    assert cmd[-4:] == ["-m", "stages.train.rank.worker", "--spec", "/tmp/spec.json"]
    assert "--log-dir=/job/result/torchrun" in torchrun_command("/tmp/spec.json", 4, log_dir="/job/result/torchrun")


# A torchrun stand-in: on SIGTERM it stops its worker and exits, as torchrun's agent does. It names its pids only
# once the worker runs: Popen returns when execve closes the close-on-exec fds, before the kernel has set the new
# argv, and on a loaded box _alive() then saw an empty cmdline (1 run in 30 failed so, beside CPU burners).
TORCHRUN_LIKE_JOB = r"""
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                         stdout=subprocess.PIPE, text=True)
child.stdout.readline()
def stop(signum, frame):
    child.terminate()
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print(f"[rank 0] pids {os.getpid()} {child.pid}", flush=True)
print("job ready", flush=True)
time.sleep(600)
"""

FLOW_PROCESS = r"""
import sys
from stages.jobs.launcher import launch
launch("unused", 1, result_dir=sys.argv[1], log=lambda line: print(line, flush=True), timeout_s=600,
       command=[sys.executable, "-c", sys.argv[2]])
"""


def _read_until(stream: IO[str], text: str) -> list[str]:
    lines = []
    for line in stream:
        lines.append(line.rstrip("\n"))
        if line.strip() == text:
            return lines
    raise AssertionError(f"no {text!r} in {lines}")


def _orphans_after(pids: list[int], timeout_s: float = 30) -> list[int]:
    """The pids still alive ``timeout_s`` after their launcher died; SIGKILLed, so a failing run leaves none."""
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = [pid for pid in pids if _alive(pid)]
    for pid in orphans:
        psutil.Process(pid).kill()
    return orphans


def test_job_stops_when_the_launching_process_is_killed(tmp_path: Path):
    """SIGKILL leaves the launcher no chance to clean up: the job's supervisor must stop it."""
    flow = subprocess.Popen([sys.executable, "-c", FLOW_PROCESS, str(tmp_path), TORCHRUN_LIKE_JOB], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        lines = _read_until(flow.stdout, "[torchrun] job ready")
        pids = _job_pids(lines)
        assert all(_alive(pid) for pid in pids), (_states(pids), lines)
    finally:
        flow.kill()
        flow.wait()
    assert not _orphans_after(pids), lines


# Starts the job from a thread that exits once the job runs, while the process lives on (as a Prefect task thread
# may): the job's output is echoed, and its pipe kept open, so that only the thread's exit changes.
THREAD_LAUNCHER = r"""
import subprocess, sys, threading, time
from stages.jobs.lifeline import supervised
jobs = []
def start():
    cmd, fds = supervised([sys.executable, "-c", sys.argv[1]], 5)
    jobs.append(subprocess.Popen(cmd, pass_fds=fds, start_new_session=True, stdout=subprocess.PIPE, text=True))
    for line in jobs[0].stdout:
        print(line, end="", flush=True)
        if line.strip() == "job ready":
            break
thread = threading.Thread(target=start)
thread.start()
thread.join()
print("thread exited", flush=True)
time.sleep(600)
"""


def test_job_outlives_the_thread_that_started_it_but_not_the_process():
    """Linux's parent-death signal fired when the forking *thread* exited: the job must depend on the process."""
    launcher = subprocess.Popen([sys.executable, "-c", THREAD_LAUNCHER, TORCHRUN_LIKE_JOB], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)
    try:
        lines = _read_until(launcher.stdout, "thread exited")
        pids = _job_pids(lines)
        time.sleep(1)   # the parent-death signal came at once (the job was gone within ~0.1 s of the thread's exit)
        assert all(_alive(pid) for pid in pids), ("the job was stopped when the thread that started it exited",
                                                  _states(pids), lines)
    finally:
        launcher.kill()
        launcher.wait()
    assert not _orphans_after(pids), lines


def _supervise(code: str, grace_s: float = 5) -> subprocess.Popen[str]:
    cmd, fds = supervised([sys.executable, "-c", code], grace_s)
    return subprocess.Popen(cmd, pass_fds=fds, start_new_session=True, stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("code", "returncode"), [
    ("import sys; print('job says hi', flush=True); sys.exit(3)", 3),
    ("import os, signal; print('job says hi', flush=True); os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
])
def test_supervisor_exits_as_the_job_did(code: str, returncode: int):
    """``launch`` reads the status as torchrun's own: a negative one means torchrun got a signal from outside."""
    job = _supervise(code)
    out, _ = job.communicate(timeout=60)
    assert (out, job.returncode) == ("job says hi\n", returncode)


def test_supervisor_waits_for_the_job_to_stop_on_the_groups_sigterm():
    """The group's SIGTERM reaches the supervisor too: it must not exit (and ``launch`` stop waiting) first."""
    job = _supervise("import signal, sys, time\n"
                     "def stop(signum, frame):\n"
                     "    time.sleep(0.5)\n"
                     "    print('stopped', flush=True)\n"
                     "    sys.exit(0)\n"
                     "signal.signal(signal.SIGTERM, stop)\n"
                     "print('job ready', flush=True)\n"
                     "time.sleep(600)\n")
    assert job.stdout is not None and job.stdout.readline() == "job ready\n"
    os.killpg(job.pid, signal.SIGTERM)
    out, _ = job.communicate(timeout=60)
    assert (out, job.returncode) == ("stopped\n", 0)


def test_job_never_starts_when_the_launcher_is_already_gone():
    read_end, write_end = os.pipe()
    os.close(write_end)   # what the supervisor finds when the launcher died between fork and its start
    job = subprocess.run([sys.executable, "-I", "-S", SCRIPT, str(read_end), "1", "--", sys.executable, "-c",
                          "print('started')"], pass_fds=(read_end,), capture_output=True, text=True, timeout=60)
    os.close(read_end)
    assert (job.returncode, job.stdout) == (1, "")
    assert "launching process is gone" in job.stderr


def test_job_killed_by_a_signal_is_reported_as_such(tmp_path: Path):
    with pytest.raises(TrainingError, match="torchrun received SIGKILL from outside"):
        launch("unused", 1, result_dir=str(tmp_path), log=lambda line: None, timeout_s=60,
               command=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])


def test_a_rank_writes_each_line_whole_so_ranks_sharing_a_pipe_do_not_interleave():
    """``print`` writes its text and its newline apart; the ranks of a node share one pipe, so the prefixer holds
    a line until it ends (or is flushed) and writes it in one piece. A CI run lost a rank's ``pid`` line to two
    ranks' pieces interleaved."""
    from stages.runtime.rank_process import LinePrefixer

    class Recorder:
        def __init__(self) -> None:
            self.writes: list[str] = []
            self.flushes = 0

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

        def flush(self) -> None:
            self.flushes += 1
    out = Recorder()
    stream = LinePrefixer(out, "[rank 1] ")   # type: ignore[arg-type]
    print("pid 7, world size 2", file=stream)
    assert out.writes == ["[rank 1] pid 7, world size 2\n"]
    stream.write("two\nlines\nand a part")
    assert out.writes[1:] == ["[rank 1] two\n[rank 1] lines\n"]
    stream.flush()   # a part goes out when flushed (a progress bar), and the line's end follows unprefixed
    stream.write(" ended\n")
    assert out.writes[2:] == ["[rank 1] and a part", " ended\n"] and out.flushes == 1
