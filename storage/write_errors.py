"""A write the file system refuses under the artifact root (full, over quota, read-only, a file too big, no
permission) as one user-facing line: ``<stage> stage: cannot write to <root>: [Errno 28] No space left on device;
<what to do>``. ``ArtifactStore.writing`` turns a stage's failed write into it after removing what the stage wrote;
the train ranks do the same for their job directory (``stages.train.rank.worker``).
"""

from __future__ import annotations

import errno
import os

from storage.errors import GnnpipeError

__all__ = ["StoreWriteError", "write_failure"]


class StoreWriteError(GnnpipeError):
    """A stage could not write its artifact: the file system is full, over quota, read-only, refuses a file that
    big, or denies permission. Nothing half-written is left (the temporary directory is removed)."""


# What each errno means for the user. Only failures that writing alone produces are turned into one line; any other
# OSError (a bad input file, an I/O error) keeps its traceback.
_NO_ROOM_HINTS = {
    errno.ENOSPC: "free space there or pass --artifacts elsewhere",
    errno.EDQUOT: "free space within your quota or pass --artifacts elsewhere",
    errno.EFBIG: "a file outgrew what the file system or `ulimit -f` allows; raise that limit or pass --artifacts "
                 "elsewhere",
    errno.EROFS: "the file system is read-only; pass a writable --artifacts",
}
# Permission errors also come from reading (an input file): they count only for a path under the artifact root.
_DENIED = (errno.EACCES, errno.EPERM)
_DENIED_HINT = "pass an --artifacts the user running gnnpipe may write to"


def write_failure(err: BaseException, stage: str, root: str, where: str | None = None) -> StoreWriteError | None:
    """The one-line error for ``err`` if it (or what caused it) is the file system refusing a stage's write under
    artifact root ``root``; else None. ``where``: the directory to name, default ``root``."""
    cause = _write_oserror(err, root)
    if cause is None:
        return None
    hint = _NO_ROOM_HINTS.get(cause.errno or 0, _DENIED_HINT)
    return StoreWriteError(f"{stage} stage: cannot write to {where or root}: [Errno {cause.errno}] "
                           f"{cause.strerror or os.strerror(cause.errno or 0)}; {hint}")


def _write_oserror(err: BaseException | None, root: str, depth: int = 0) -> OSError | None:
    """The OSError of a refused write in ``err``, its cause/context chain or its group (zarr writes from worker
    threads; a library may re-raise), or None."""
    if err is None or depth > 8 or isinstance(err, GnnpipeError):   # a GnnpipeError already says what to do
        return None
    if isinstance(err, OSError) and err.errno in _NO_ROOM_HINTS:
        return err
    if isinstance(err, OSError) and err.errno in _DENIED and _under(err.filename, root):
        return err
    for inner in getattr(err, "exceptions", ()):   # an ExceptionGroup
        if (found := _write_oserror(inner, root, depth + 1)) is not None:
            return found
    chained = err.__cause__ if err.__cause__ is not None or err.__suppress_context__ else err.__context__
    return _write_oserror(chained, root, depth + 1)


def _under(path: object, root: str) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    try:
        return os.path.commonpath([os.path.abspath(os.fsdecode(path)), os.path.abspath(root)]) == \
            os.path.abspath(root)
    except ValueError:   # different drives, or a URL
        return False
