"""What every rank process started by torchrun does around its work (the train and infer workers share it).

Its stdout/stderr lines carry a ``[rank r]`` prefix; a failing rank writes ``error-<r>.json`` into the job's result
directory so that the launcher (``stages.jobs.launcher``) can name it and repeat a user error's message; a user
error, or a write the file system refused (a full disk: ``refused``), is one ``error:`` line and exit code 2, any
other exception its traceback and exit code 1. The caller ends the process with ``os._exit(code)``: tearing down
torch.distributed state at interpreter exit was seen to deadlock (``stages.train.rank.worker``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, TextIO, TypeVar

from stages.jobs.local_agent import INIT_METHOD_ENV  # who sets it (standard library only: nothing heavy here)
from storage import GnnpipeError, InputError
from storage.train import atomic_write_bytes, error_path

__all__ = ["JobSpec", "LinePrefixer", "RankEnv", "init_method", "rank_env", "run_rank", "write_error"]



_Spec = TypeVar("_Spec", bound="JobSpec")


class JobSpec:
    """A job's spec file (a dataclass of JSON values), written by the stage and read by each rank; ``JOB`` names
    the stage in the error a rank gives for a file it cannot read."""

    JOB: ClassVar[str]

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=2, sort_keys=True)   # type: ignore[call-overload]

    @classmethod
    def load(cls: type[_Spec], path: str | os.PathLike[str]) -> _Spec:
        try:
            with open(path) as f:
                return cls(**json.load(f))
        except (OSError, json.JSONDecodeError, TypeError) as err:
            raise InputError(f"cannot read the {cls.JOB} job spec {path} ({err})") from None


class LinePrefixer:
    """A text stream that starts every line with ``prefix`` (prints, logging, warnings and tracebacks alike).

    A line goes out in one write once it is complete (or at ``flush``): the ranks of a node share one pipe, and
    ``print`` writes its text and its newline separately, so two ranks' lines written piece by piece could
    interleave ("[rank 0] pid 1[rank 1] pid 2" then two newlines), which lost a rank's pid line in a CI run and
    would hide a rank's ``error:`` line from the launcher. Writes up to PIPE_BUF (4 KiB) are atomic."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self.stream, self.prefix, self._at_line_start = stream, prefix, True
        self._partial = ""   # the current line's text, not written yet

    def write(self, text: str) -> int:
        done, newline, self._partial = (self._partial + text).rpartition("\n")
        if newline:
            self._emit(done + newline)
        return len(text)

    def flush(self) -> None:
        if self._partial:   # a line without its end yet (a prompt, a progress bar): out as it is
            text, self._partial = self._partial, ""
            self._emit(text)
        self.stream.flush()

    def _emit(self, text: str) -> None:
        pieces = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start:
                pieces.append(self.prefix)
            pieces.append(piece)
            self._at_line_start = piece.endswith("\n")
        self.stream.write("".join(pieces))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class RankEnv:
    """torchrun's environment of this process: global and local rank and world size."""

    def __init__(self, environ: dict[str, str] | os._Environ[str]) -> None:
        self.rank, self.world = int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1))
        self.local_rank = int(environ.get("LOCAL_RANK", 0))
        self.local_world = int(environ.get("LOCAL_WORLD_SIZE", 1))


def rank_env() -> RankEnv:
    return RankEnv(os.environ)


def init_method() -> str | None:
    """How this rank joins its process group: the single-host agent's file store (``file://...?rank=&world_size=``,
    ``stages.jobs.local_agent``), or None for torchrun's ``env://`` (``MASTER_ADDR``/``MASTER_PORT``)."""
    return os.environ.get(INIT_METHOD_ENV) or None


def write_error(spec_path: str, rank: int, err: BaseException) -> None:
    """``error-<rank>.json`` in the result directory the job spec names (best effort: the log line matters more)."""
    try:
        result_dir = json.loads(Path(spec_path).read_text())["result_dir"]
        record = {"rank": rank, "time": time.time(), "type": type(err).__name__,
                  "user_error": isinstance(err, GnnpipeError),
                  "message": str(err).splitlines()[0] if str(err) else type(err).__name__}
        atomic_write_bytes(error_path(result_dir, rank), json.dumps(record).encode())
    except Exception:  # noqa: BLE001 - the log line is what matters; the file only helps the launcher
        pass


def run_rank(spec_path: str, env: RankEnv, work: Callable[[], None], *,
             refused: Callable[[BaseException], GnnpipeError | None],
             quiet: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``work`` as rank ``env.rank`` of a job; the process's exit code (see the module docstring).

    ``refused(err)``: the one-line error for a write the file system refused, or None. ``quiet``: exceptions that
    are consequences of another rank's failure (that rank says why): recorded, not printed.
    """
    sys.stdout = LinePrefixer(sys.stdout, f"[rank {env.rank}] ")
    sys.stderr = LinePrefixer(sys.stderr, f"[rank {env.rank}] ")
    print(f"pid {os.getpid()}, world size {env.world}, host {os.uname().nodename}", flush=True)
    try:
        work()
    except GnnpipeError as err:
        write_error(spec_path, env.rank, err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except quiet as err:
        write_error(spec_path, env.rank, err)
        return 1
    except BaseException as err:  # noqa: BLE001 - report every crash with the rank's prefix, then fail
        if (one_line := refused(err)) is not None:   # e.g. a full disk: one line, no traceback
            write_error(spec_path, env.rank, one_line)   # may fail too: the launcher also reads the line below
            print(f"error: {one_line}", file=sys.stderr, flush=True)
            return 2
        traceback.print_exc()
        write_error(spec_path, env.rank, err)
        return 1
    return 0
