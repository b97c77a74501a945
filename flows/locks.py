"""Stage locks that die with their holder: the lock manager of the stages' Prefect transactions.

Two runs of the same configuration must not build the same stage at once: each stage task runs in a SERIALIZABLE
transaction (``flows.tasks.cache_policy``), which holds a lock named after the task's cache key
(``<stage>-<artifact key>-outcome1``) while the stage runs. Prefect's ``FileSystemLockManager`` writes
``{"holder": uuid, "expiration": null}``: a run killed with SIGKILL (the OOM killer) leaves that file, and every
later run of the configuration waits on it forever, printing nothing. Here a lock file says who holds it
(:class:`flows.holders.Holder`: pid, host, start time, command, since when, last heartbeat), and:

- a lock whose holder is dead (same host: its process is gone; other hosts: its heartbeat stopped) is taken over at
  once, with one note line saying whose it was;
- a lock whose holder is alive makes the new run say who holds it and wait, repeating that every
  :data:`REMIND_S`, or fail at once with one ``error:`` line when the run was asked not to wait (``--no-wait``);
- ``gnnpipe clean`` removes the stale locks of the stages it cleans (:func:`stale_locks`).

Every change to a lock file (create, take over, renew, release) happens under an exclusive ``flock`` of the
directory's ``.guard`` file and replaces the file whole (write, then rename), so no reader sees half a record and no
two runs take over the same stale lock. The directory is always local (``flows.records.prefect_dir``); on a shared
file system Linux maps ``flock`` to POSIX locks, which NFS carries between hosts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.holders import HEARTBEAT_S, Holder
from flows.interrupts import Interrupted
from flows.records import locks_dir, task_key
from storage import ArtifactStore, GnnpipeError, leftovers

POLL_S = 0.2      # how often a waiting run looks again: a released lock is taken within 0.2 s
REMIND_S = 60.0   # a waiting run repeats whom it waits for: a silent wait looks like a hang (the bug this fixes)
SUFFIX = ".lock"
_log = logging.getLogger("gnnpipe.locks")


class StageBusyError(GnnpipeError):
    """The stage is being built by another live run, and this run was asked not to wait (``--no-wait``)."""


def stage_of(key: str) -> str:
    """The stage a lock key names: ``train`` of ``train-1a2b...-outcome1``."""
    return key.split("-", 1)[0]


def say(message: str) -> None:
    """A note for the person running: through the flow run's logger (terminal and UI), else on stderr."""
    try:
        from prefect.logging import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # noqa: BLE001 (outside a flow or task run: no run logger exists)
        print(f"note: {message}", file=sys.stderr, flush=True)


class _Heartbeat(threading.Thread):
    """Renews every lock this process holds each :data:`HEARTBEAT_S` (what other hosts judge liveness by)."""

    _instance: _Heartbeat | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        super().__init__(name="gnnpipe-lock-heartbeat", daemon=True)
        self.held: dict[tuple[str, str], tuple[StageLockManager, str]] = {}   # (dir, key) -> (manager, token)
        self.mutex = threading.Lock()

    @classmethod
    def get(cls) -> _Heartbeat:
        with cls._guard:
            if cls._instance is None or not cls._instance.is_alive():
                cls._instance = cls()
                cls._instance.start()
            return cls._instance

    @classmethod
    def forget(cls, manager: StageLockManager, key: str) -> None:
        """Stop renewing ``key`` (without starting a heartbeat thread where none runs)."""
        if cls._instance is not None:
            cls._instance.discard(manager, key)

    def add(self, manager: StageLockManager, key: str, token: str) -> None:
        with self.mutex:
            self.held[(str(manager.directory), key)] = (manager, token)

    def discard(self, manager: StageLockManager, key: str) -> None:
        with self.mutex:
            self.held.pop((str(manager.directory), key), None)

    def run(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self.mutex:
                held = list(self.held.items())
            for (_, key), (manager, token) in held:
                if not manager.renew(key, token):
                    self.discard(manager, key)


class StageLockManager:
    """A ``prefect.locking.protocol.LockManager`` whose locks die with their holder (module docstring).

    ``wait``: wait for a live holder (saying so), or raise :class:`StageBusyError` at once.
    """

    def __init__(self, directory: Path, *, wait: bool = True) -> None:
        self.directory = directory.expanduser().resolve()
        self.wait = wait

    # ---- files ----------------------------------------------------------------------------------------------------
    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".guard", "a") as guard:
            try:
                import fcntl
            except ImportError:   # not POSIX: the rename still keeps records whole
                yield
                return
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)

    def read(self, key: str) -> dict[str, Any] | None:
        """The lock record of ``key`` (None if unlocked); an unreadable file is a record with no holder."""
        try:
            text = self.path(key).read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, key: str, record: dict[str, Any]) -> None:
        tmp = self.path(key).with_name(f".{key}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path(key))

    # ---- the LockManager protocol ---------------------------------------------------------------------------------
    def acquire_lock(self, key: str, holder: str, acquire_timeout: float | None = None,
                     hold_timeout: float | None = None) -> bool:
        """Take the lock of ``key`` for ``holder`` (a transaction's id): at once if free or its holder is dead,
        else after the live holder releases it (saying whom it waits for), or never if ``acquire_timeout`` passes.
        ``hold_timeout`` (unused by Prefect's transactions) is not supported: a lock lasts while its holder does."""
        start = time.monotonic()
        reminded: float | None = None
        owner: Holder | None = None
        try:
            while True:
                with self._guarded():
                    current = self.read(key)
                    other = None if current is None or current.get("holder") == holder else current
                    owner = None if other is None else Holder.from_record(other)
                    if other is None or owner is None or not owner.alive():
                        self._write(key, {"holder": holder, **Holder.current().record()})
                        _Heartbeat.get().add(self, key, holder)
                        if other is not None:
                            self._took_over(key, owner)
                        return True
                if not self.wait:
                    raise StageBusyError(f"{stage_of(key)} is being built by another run: {owner.describe()}; wait "
                                         f"for it to finish, or rerun without --no-wait to queue behind it")
                waited = time.monotonic() - start
                if acquire_timeout is not None and waited >= acquire_timeout:
                    return False
                if reminded is None or time.monotonic() - reminded >= REMIND_S:
                    reminded = time.monotonic()
                    still = f" (still, after {waited:.0f} s)" if waited >= 1 else ""
                    say(f"{stage_of(key)}: waiting{still} for another run that is building it: "
                        f"{owner.describe()}; Ctrl-C stops this one, --no-wait makes it fail at once instead")
                time.sleep(POLL_S)
        except Interrupted as exc:   # SIGINT/SIGTERM: the CLI's line says which stage this run was waiting for
            if owner is not None:
                exc.waiting_for = (stage_of(key), owner.describe())
            raise

    async def aacquire_lock(self, key: str, holder: str, acquire_timeout: float | None = None,
                            hold_timeout: float | None = None) -> bool:
        return self.acquire_lock(key, holder, acquire_timeout, hold_timeout)

    def release_lock(self, key: str, holder: str) -> None:
        """Remove ``holder``'s lock. A lock that is gone (``gnnpipe clean``) or now another's (taken over while
        this host looked dead) is left as it is."""
        _Heartbeat.forget(self, key)
        with self._guarded():
            current = self.read(key)
            if current is not None and current.get("holder") == holder:
                self.path(key).unlink(missing_ok=True)

    def is_locked(self, key: str) -> bool:
        """Whether a live holder has the lock of ``key``."""
        with self._guarded():
            current = self.read(key)
        owner = None if current is None else Holder.from_record(current)
        return owner is not None and owner.alive()

    def is_lock_holder(self, key: str, holder: str) -> bool:
        with self._guarded():
            current = self.read(key)
        return current is not None and current.get("holder") == holder

    def wait_for_lock(self, key: str, timeout: float | None = None) -> bool:
        """Wait until no live holder has the lock (Prefect's read of a cache record)."""
        start = time.monotonic()
        while self.is_locked(key):
            if timeout is not None and time.monotonic() - start >= timeout:
                return False
            time.sleep(POLL_S)
        return True

    async def await_for_lock(self, key: str, timeout: float | None = None) -> bool:
        return self.wait_for_lock(key, timeout)

    # ---- heartbeat and takeover -----------------------------------------------------------------------------------
    def renew(self, key: str, holder: str) -> bool:
        """Refresh ``holder``'s heartbeat; False once the lock is no longer its."""
        with self._guarded():
            current = self.read(key)
            if current is None or current.get("holder") != holder:
                if current is not None:
                    _log.warning("the lock of %s was taken over by %s", key, Holder.from_record(current))
                return False
            owner = Holder.from_record(current)
            if owner is not None:
                self._write(key, {**current, **owner.renew().record()})
            return True

    def _took_over(self, key: str, owner: Holder | None) -> None:
        whose = "a lock that names no process (written by an older gnnpipe)" if owner is None else \
            f"the lock of {owner.describe()}, which died without releasing it"
        say(f"{stage_of(key)}: took over {whose}")




def tidy(root: str, stage: str, key: str) -> list[Path]:
    """Remove what earlier attempts at ``stage/key`` left beside its artifact (``storage.leftovers``), now that the
    artifact is valid: train checkpoints of a forced rebuild that failed, a killed run's work directories. Only if
    no live run is building that key (its lock is free): a forced rebuild under way keeps its checkpoints."""
    manager, holder, name = StageLockManager(locks_dir(root)), f"tidy-{uuid.uuid4()}", task_key(stage, key)
    if not manager.acquire_lock(name, holder, acquire_timeout=0):
        return []
    try:
        return leftovers.remove_all(ArtifactStore(root), stage, key)
    finally:
        manager.release_lock(name, holder)


def stale_locks(directory: Path, stage: str | None = None) -> tuple[list[Path], list[tuple[Path, Holder]]]:
    """The lock files of ``stage`` (or every stage) in ``directory``: ``(stale, live)``, live ones with their
    holders. Stale: the holder is dead, or the file names none."""
    stale: list[Path] = []
    live: list[tuple[Path, Holder]] = []
    if not directory.is_dir():
        return stale, live
    manager = StageLockManager(directory)
    for path in sorted(directory.glob(f"{stage or '*'}-*{SUFFIX}")):
        record = manager.read(path.name.removesuffix(SUFFIX))
        owner = None if record is None else Holder.from_record(record)
        if owner is not None and owner.alive():
            live.append((path, owner))
        elif record is not None:
            stale.append(path)
    return stale, live


def remove_stale(directory: Path, stage: str | None = None) -> tuple[int, list[tuple[Path, Holder]]]:
    """Delete the stale locks of ``stage`` (or all): ``(how many, the live ones left in place)``."""
    manager = StageLockManager(directory)
    if not directory.is_dir():
        return 0, []
    with manager._guarded():
        stale, live = stale_locks(directory, stage)
        for path in stale:
            path.unlink(missing_ok=True)
    return len(stale), live
