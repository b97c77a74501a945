"""A full (or otherwise refusing) file system under the artifact root: one ``error:`` line naming the stage, the root
and the OSError, exit code 2, nothing half-written.

What broke (issue 12, item 2): on a small tmpfs a run exited 1 after a ~200-line traceback (zarr's ``OSError: [Errno
28] No space left on device`` from a worker thread), with no ``error:`` line and neither the stage nor the root named.

Two ways to make a file system refuse: a real size-limited tmpfs (``mount -t tmpfs -o size=...``: needs root or
CAP_SYS_ADMIN, skipped otherwise), and, everywhere, a file-size limit (``RLIMIT_FSIZE``: a write past it fails with
EFBIG once SIGXFSZ is ignored) set in a subprocess, so that no other file of the test session is limited.
"""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stages.download import stage as download
from stages.jobs.launcher import launch
from stages.train.rank.worker import refused_write
from storage import ArtifactStore, GnnpipeError, InputError
from storage.write_errors import StoreWriteError, write_failure
from tests.conftest import GNNPIPE, REPO, TINY, cli_env

SMALL = "256k"   # holds the root's probe and Prefect's records, not TINY's graph (~0.9 MB of Zarr chunks)
ENOSPC_LINE = "[Errno 28] No space left on device; free space there or pass --artifacts elsewhere"


@contextmanager
def small_tmpfs(path: Path, size: str = SMALL) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block; skips the test where mounting is not allowed."""
    path.mkdir(parents=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no `mount` command: cannot make a size-limited tmpfs")
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def leftovers(root: Path, stage: str) -> list[str]:
    """What a failed build left in ``root/stage`` (nothing, when cleanup is right)."""
    where = root / stage
    return sorted(p.name for p in where.iterdir()) if where.exists() else []


def test_a_full_tmpfs_fails_the_stage_in_one_line_and_leaves_nothing(tmp_path: Path):
    with small_tmpfs(tmp_path / "small") as small:
        root = small / "art"
        params = download.Params(**{k: v for k, v in TINY.items() if k != "num_partitions"})
        with pytest.raises(StoreWriteError) as err:
            download.run(ArtifactStore(root), params, {}, progress=False)
        assert str(err.value) == f"download stage: cannot write to {root}: {ENOSPC_LINE}"
        assert isinstance(err.value, GnnpipeError) and err.value.__cause__ is None
        assert leftovers(root, "download") == [], "the temporary directory is removed"


# Runs every stage in a subprocess: upstream built without a limit, then the stage forced under a file-size limit of
# 16 KiB (every stage of TINY writes a Zarr chunk or a file bigger than that; train: its ranks, which inherit the
# limit, a checkpoint), then built again without it (but the last).
LIMITED = r"""
import json, resource, signal, sys
from pathlib import Path
from flows.config import STAGES, make_config
from storage import ArtifactStore, GnnpipeError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG instead of killing us
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
cfg = make_config(json.loads(sys.argv[1]))
store, built, said, kept = ArtifactStore(cfg.artifacts), {}, {}, []
for name in cfg.stages():
    module = STAGES[name]
    upstream = {u: built[u] for u in module.UPSTREAM}
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, hard))
    try:
        module.run(store, cfg.stage_params(name), upstream, force=True, progress=False)
        said[name] = "built under the limit"
    except GnnpipeError as err:
        said[name] = f"{type(err).__name__}: {err}"
        if name == "train":   # what a rerun would resume from, before the rebuild below publishes and removes it
            kept = sorted(str(p) for p in Path(cfg.artifacts, ".checkpoints").rglob("*"))
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    if name != cfg.stages()[-1]:
        built[name] = module.run(store, cfg.stage_params(name), upstream, progress=False)
print(json.dumps({"said": said, "kept": kept}))
"""


def test_a_file_size_limit_fails_every_stage_in_one_line_and_leaves_nothing(tmp_path: Path):
    root = tmp_path / "art"
    values = {**TINY, "artifacts": str(root), "fanouts": [5, 5], "batch_size": 64, "hidden": 16, "epochs": 2,
              "threads_per_rank": 1, "timeout_s": 240.0}
    proc = subprocess.run([sys.executable, "-c", LIMITED, json.dumps(values)], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    said, kept = printed["said"], [Path(p) for p in printed["kept"]]
    assert list(said) == ["download", "partition", "features", "hotness", "train", "infer"]
    efbig = ("[Errno 27] File too large; a file outgrew what the file system or `ulimit -f` allows; raise that limit "
             "or pass --artifacts elsewhere")
    trained = said.pop("train")
    # an infer rank could not write its outputs: the launcher repeats its one line. Which rank's write fails first
    # is a race (each writes its hidden layer in the background, beside its next layer)
    inferred = said.pop("infer")
    assert re.fullmatch(rf"InputError: rank [01]: infer stage: cannot write to {re.escape(f'{root}: {efbig}')}",
                        inferred), inferred
    assert leftovers(root, "infer") == [], "the last stage is not rebuilt: nothing of the failed one is left"
    for stage, message in said.items():
        assert message == f"StoreWriteError: {stage} stage: cannot write to {root}: {efbig}", message
        assert not [n for n in leftovers(root, stage) if n.startswith(".tmp-")], stage
        assert len(leftovers(root, stage)) == 1, "only the artifact built afterwards"
    # a rank could not write its checkpoint: the launcher repeats its one line; the job directory is kept to resume
    job = next(p for p in kept if p.parent == root / ".checkpoints")
    assert trained == (f"InputError: rank 0: train stage: cannot write to {job}: {efbig} (the checkpoints written so "
                       f"far were kept: a rerun resumes)"), trained
    assert not [p for p in kept if ".tmp-" in p.name]
    assert len(leftovers(root, "train")) == 1, "only the artifact built afterwards"


def test_which_oserrors_are_refused_writes(tmp_path: Path):
    root = str(tmp_path / "art")
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        failure = write_failure(OSError(code, "x"), "features", root)
        assert failure is not None and str(failure).startswith(f"features stage: cannot write to {root}: [Errno "
                                                                f"{code}] x; ")
    # found behind a wrapper (a library that re-raises)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("zarr could not store a chunk") from inner
    except RuntimeError as wrapped:
        assert write_failure(wrapped, "partition", root) is not None
    # permission errors only under the root: an unreadable input file is not the artifact root's fault
    assert write_failure(PermissionError(errno.EACCES, "Permission denied", f"{root}/s/.tmp-1/x"), "s", root)
    assert write_failure(PermissionError(errno.EACCES, "Permission denied", "/data/x.npy"), "s", root) is None
    # not a refused write: a missing file, an I/O error, a user error that already says what to do
    assert write_failure(FileNotFoundError(errno.ENOENT, "No such file", f"{root}/x"), "s", root) is None
    assert write_failure(OSError(errno.EIO, "Input/output error"), "s", root) is None
    assert write_failure(GnnpipeError("rank 0: ..."), "s", root) is None


def test_a_rank_that_cannot_write_its_checkpoint_says_so_in_one_line(tmp_path: Path):
    """The train stage's ranks write checkpoints and results into the job directory, beside the artifacts: a full
    disk there is the same user error, with the checkpoints kept."""
    spec = tmp_path / "spec.json"
    job = tmp_path / "art" / ".checkpoints" / "train-0123456789abcdef"
    spec.write_text(json.dumps({"checkpoint_dir": str(job)}))
    refused = refused_write(str(spec), OSError(errno.ENOSPC, "No space left on device"))
    assert refused is not None and str(refused) == (f"train stage: cannot write to {job}: {ENOSPC_LINE} (the "
                                                     f"checkpoints written so far were kept: a rerun resumes)")
    assert refused_write(str(spec), ValueError("a bug")) is None


def test_the_cli_on_a_full_tmpfs_prints_one_error_line_and_exits_2(tmp_path: Path):
    """``gnnpipe run`` through Prefect (a temporary server): the stage's error reaches ``main`` as itself."""
    with small_tmpfs(tmp_path / "small") as small:
        root = small / "art"
        sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]
        proc = subprocess.run([*GNNPIPE, "run", "--until", "download", "--artifacts", str(root), *sets], cwd=REPO,
                              env=cli_env(), capture_output=True, timeout=300)
        # bytes, split at newlines only: text mode would turn a progress bar's \r into line ends, and hide an
        # error line glued to what a bar left on its line
        stderr = proc.stderr.decode()
        errors = [line for line in stderr.split("\n") if "error:" in line]
        assert errors == [f"error: download stage: cannot write to {root}: {ENOSPC_LINE}"], stderr[-3000:]
        assert proc.returncode == 2
        # the ~200 lines of zarr's OSError traceback are gone (Prefect's own logging of the failed task and flow is
        # filtered separately: item 3, tests/test_flow.py)
        assert "OSError" not in stderr and "zarr" not in stderr, stderr[-3000:]
        assert leftovers(root, "download") == []


def test_the_error_line_is_its_own_line_after_a_bar_left_open(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]):
    """A stage that fails inside a progress bar's loop (a chunked write on a full disk) leaves the bar open, its
    line ended by no newline: the error line was glued to it."""
    from flows import cli
    from storage.progress import progress

    def fails_mid_bar(cfg: object) -> None:
        bar = progress(total=8, desc="write x", disable=False, mininterval=0)
        bar.update(3)
        raise write_failure(OSError(errno.ENOSPC, "No space left on device"), "download", "/data/art") or \
            AssertionError("not a refused write")

    monkeypatch.setattr(cli, "_run", fails_mid_bar)
    monkeypatch.setattr(sys, "argv", ["gnnpipe", "run", "--artifacts", "/data/art"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "write x:  38%" in err, err
    assert err.endswith(f"\nerror: download stage: cannot write to /data/art: {ENOSPC_LINE}\n"), repr(err)
    bar_line = err.split("\n")[0]   # every redraw of the bar, then its blanking
    assert bar_line.endswith("\r") and bar_line.split("\r")[-2].strip() == "", "the bar is cleared, not left drawn"


def test_the_launcher_repeats_a_rank_s_error_line_when_its_error_file_could_not_be_written(tmp_path: Path):
    """On a full disk the rank's ``error-<r>.json`` may not be written either: its ``error:`` line is enough."""
    said = f"train stage: cannot write to {tmp_path}: {ENOSPC_LINE}"
    job = f"import sys; print({f'[rank 0] error: {said}'!r}, flush=True); sys.exit(2)"
    with pytest.raises(InputError) as err:
        launch("unused", 1, result_dir=str(tmp_path), log=lambda line: None, timeout_s=60,
               command=[sys.executable, "-c", job])
    assert str(err.value) == f"rank 0: {said}"
