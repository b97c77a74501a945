"""Ctrl-C, ``timeout``, ``docker stop``, systemd and Slurm signal the whole process group of ``gnnpipe run``.

What broke (issue 12, item 1): the temporary Prefect server was in that group and died first; gnnpipe's shutdown
then retried the dead API for 90-120 s ("Error logging to API", a ConnectError traceback) before SIGKILL, and
SIGTERM printed Prefect's crash records and torchrun's teardown instead of saying what happened. Now the server and
torchrun run in sessions of their own, the signal becomes an exception in gnnpipe's main thread, and the run ends
within seconds with one line, exit 128 + signal, nothing left running, and a rerun resumes from the checkpoints.

Two real runs (tens of seconds on a loaded 2-core box): the first is interrupted with SIGINT mid-training, the second
resumes from its checkpoint and is interrupted with SIGTERM.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest

from flows import interrupts
from flows.interrupts import Interrupted, interrupted_stage, interruption, message
from stages.jobs.local_agent import rank_name
from tests._cli_runs import GnnpipeRun
from tests.conftest import TINY

EXIT_WITHIN_S = 10.0   # the bound, from the signal to the exit of gnnpipe


def _assert_nothing_left(tree: dict[psutil.Process, str]) -> None:
    names = {p.pid: name for p, name in tree.items()}
    assert any("uvicorn" in n for n in names.values()), f"no temporary server among {names}"
    assert any("local_agent.py" in n for n in names.values()), f"no single-host agent among {names}"
    forked, afresh = rank_name(0).removesuffix("0"), "-m stages.train.rank.worker"   # the agent's two ways
    ranks = [n for n in names.values() if n.startswith(forked) or afresh in n]
    assert len(ranks) == TINY["num_partitions"], names
    _, alive = psutil.wait_procs(list(tree), timeout=3)   # slack for the kernel to reap what just exited
    left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"left running: {[names.get(p.pid, p.pid) for p in left]}"


@pytest.mark.slow
def test_group_signals_stop_the_run_at_once_and_a_rerun_resumes(tmp_path: Path):
    values = {**TINY, "fanouts": [5, 5], "batch_size": 64, "hidden": 16, "epochs": 200}
    args = [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    args += ["--artifacts", str(tmp_path / "art")]

    first = GnnpipeRun(args)
    first.wait_for("epoch 2/200")   # a checkpoint is written after every epoch
    tree, elapsed = first.signal_group(signal.SIGINT)
    said = first.last_line()
    assert first.proc.returncode == 130, said
    assert elapsed < EXIT_WITHIN_S, f"{elapsed:.1f} s"
    assert said.startswith("interrupted by SIGINT during stage train: ") and "checkpoints kept" in said
    assert "rerun the same command to resume training" in said
    _assert_nothing_left(tree)
    assert list((tmp_path / "art" / ".checkpoints").glob("train-*/ckpt-*.pt")), "no checkpoint to resume from"

    second = GnnpipeRun(args)
    second.wait_for("resuming from the checkpoint")
    tree, elapsed = second.signal_group(signal.SIGTERM)
    said = second.last_line()
    assert second.proc.returncode == 143, said
    assert elapsed < EXIT_WITHIN_S, f"{elapsed:.1f} s"
    assert said.startswith("interrupted by SIGTERM during stage train: ") and "checkpoints kept" in said
    _assert_nothing_left(tree)


def _raise_in(module: str, exc: BaseException) -> BaseException:
    """``exc`` raised from a frame of ``module`` (as if that module's code was running), caught here."""
    try:
        exec("def interrupted():\n    raise exc\ninterrupted()", {"__name__": module, "exc": exc})
    except BaseException as caught:  # noqa: BLE001 (the exception under test)
        return caught
    raise AssertionError("not raised")


def test_the_interrupted_stage_is_named_from_the_traceback():
    assert interrupted_stage(_raise_in("stages.partition.compute", Interrupted(signal.SIGINT))) == "partition"
    assert interrupted_stage(_raise_in("flows.pipeline", Interrupted(signal.SIGINT))) is None
    assert interrupted_stage(_raise_in("stages.protocol", Interrupted(signal.SIGINT))) is None   # not a stage
    # SIGTERM during a flow run: Prefect's own handler raised first, ours while Prefect handled that (in the train
    # stage's frame, which calls the launcher: stages.jobs is no stage)
    assert interrupted_stage(_raise_in("stages.jobs.launcher", Interrupted(signal.SIGTERM))) is None
    try:
        try:
            raise _raise_in("stages.train.stage", RuntimeError("Prefect's TerminationSignal"))
        except RuntimeError:
            raise Interrupted(signal.SIGTERM) from None
    except Interrupted as exc:
        assert interrupted_stage(exc) == "train"
        assert exc.exit_code == 143 and "interrupted by SIGTERM during stage train: " in message(exc, "train")
    assert message(Interrupted(signal.SIGINT), None).startswith("interrupted by SIGINT (no stage was running); ")


def test_an_interruption_a_library_wrapped_in_its_own_error_is_still_the_interruption(monkeypatch):
    """The CI saw the handler's Interrupted come back as ``PydanticSerializationError: ... Interrupted: SIGINT
    received`` (raised in a callback from pydantic's Rust serialiser, unchained): the CLI must still say one line."""
    def wrapped() -> BaseException:   # what a C extension does with a callback's exception: a new, unchained error
        try:
            raise _raise_in("stages.features.compute", Interrupted(signal.SIGINT))
        except Interrupted as exc:
            err = ValueError(f"Error calling function `_ser_model`: {exc}")
        err.__context__ = None   # made in native code: nothing links it to the Interrupted
        return err

    assert interruption(wrapped()) is None, "no signal handled: a real error stays an error"
    monkeypatch.setattr(interrupts._State, "handled", signal.SIGINT)
    stopped = interruption(wrapped())
    assert isinstance(stopped, Interrupted) and stopped.exit_code == 130
    chained = _raise_in("stages.train.stage", Interrupted(signal.SIGTERM))
    try:
        raise RuntimeError("cleanup failed") from chained
    except RuntimeError as err:
        assert interruption(err) is chained, "an Interrupted in the chain is the one"
    later = interruption(ValueError("any error after the signal"))
    assert later is not None and later.name == "SIGINT"
