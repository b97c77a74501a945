"""Whether another process, on this host or another (a Dask worker), sees the artifact root this process writes.

The caller writes ``<root>/.reach-<token>`` holding the token; every other process reads it back through fsspec,
as the stage's units will read and write the root. A root path that exists where the worker runs but is another
disk (the same mount point, not shared) fails too: the file is missing there, or holds another token. The file is
removed however the check ends, so a failed check leaves nothing under the root; only a SIGKILL during the check
(a fraction of a second) leaves it, and ``gnnpipe clean`` removes such leftovers (:func:`remove_tokens`).
``gnnpipe status`` lists the stages' directories only, so a leftover token is never shown as a build.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import fsspec

from storage.store import ArtifactStore

_PREFIX = ".reach-"


@contextmanager
def reach_token(store: ArtifactStore) -> Iterator[tuple[str, str]]:
    """Write the token file under ``store``'s root; yields its URL and the token, removes it at the end."""
    token = uuid.uuid4().hex
    name = f"{_PREFIX}{token}"
    store.fs.makedirs(store.base, exist_ok=True)
    store.fs.pipe_file(f"{store.base}/{name}", token.encode())
    try:
        yield store.url(name), token
    finally:
        with contextlib.suppress(FileNotFoundError):   # `gnnpipe clean` meanwhile
            store.fs.rm_file(f"{store.base}/{name}")


def remove_tokens(store: ArtifactStore) -> list[str]:
    """Delete the token files under ``store``'s root (a killed check's, or a live one's: ``gnnpipe clean`` removes
    what a run is writing anyway); returns their URLs."""
    found = sorted(store.fs.glob(f"{store.base}/{_PREFIX}*"))
    for path in found:
        store.fs.rm_file(path)
    return [store.url(path.rsplit("/", 1)[-1]) for path in found]


def read_token(url: str, token: str) -> str | None:
    """None if ``url`` holds ``token`` as seen from this process, else why not (one phrase)."""
    try:
        with fsspec.open(url, "rb") as f:
            got = f.read(64).decode(errors="replace")
    except FileNotFoundError:
        return f"{url} not found there"
    except Exception as err:  # noqa: BLE001 - any failure to read is the answer (credentials, network, mounts)
        return f"{type(err).__name__}: {err}"
    return None if got == token else f"{url} holds another build's token there (not the same storage)"
