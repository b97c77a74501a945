"""Who holds something (a stage lock, a flow run), and whether that holder is still alive.

A :class:`Holder` names a process the way a person needs it (pid, host, the command, since when) and the way a
machine can check it:

- **same host** (hostname and Linux boot id match): alive while a process with that pid exists, is not a zombie
  and started at the recorded time. The start time is what tells a dead holder from a new process that got its pid
  back; the boot id tells a holder from before a reboot. No waiting: a SIGKILLed holder is dead at once.
- **another host** (a shared artifact root): it cannot be asked, so the holder renews ``renewed`` every
  :data:`HEARTBEAT_S` and counts as dead :data:`TTL_S` after the last renewal.

The renewal is a thread. A C extension that keeps the GIL longer than ``TTL_S`` (METIS on a large graph) can let a
live holder on another host look dead; what that costs is a duplicated build, never a wrong one: builds are
idempotent and published by an atomic rename (``storage.store``).
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import psutil

HEARTBEAT_S = 15.0   # a renewal costs one small file write
TTL_S = 120.0        # 8 missed renewals: a loaded box or a GIL-holding call does not make a live holder look dead
_START_TOLERANCE_S = 0.05   # psutil's create_time is boot time + start ticks (1/100 s): the same on every read


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:   # not Linux: the host name alone (a reboot is then only told by the start time)
        return ""


def _start_time(pid: int) -> float | None:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except psutil.Error:
        return None


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _command() -> str:
    from storage.inventory import current_origin

    return current_origin() or " ".join(sys.argv)


@dataclass(frozen=True)
class Holder:
    """A process that holds something, as recorded in a lock file or a run record."""

    pid: int
    host: str
    boot_id: str
    started: float | None   # the process's start time (epoch seconds), None if unknown
    command: str            # how the run was invoked (``GNNPIPE_ORIGIN``, else argv)
    since: str              # ISO time (UTC) the hold began
    renewed: float          # epoch seconds of the last heartbeat
    ttl_s: float = TTL_S

    @classmethod
    def current(cls) -> Holder:
        pid = os.getpid()
        return cls(pid=pid, host=socket.gethostname(), boot_id=_boot_id(), started=_start_time(pid),
                   command=_command(), since=_now_iso(), renewed=time.time())

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Holder | None:
        """The holder a record names, or None for a record without one (a lock written by Prefect's own lock
        manager, as gnnpipe did before, which says neither who nor where: nobody can still be holding it)."""
        try:
            return cls(pid=int(data["pid"]), host=str(data["host"]), boot_id=str(data.get("boot_id", "")),
                       started=None if data.get("started") is None else float(data["started"]),
                       command=str(data.get("command", "")), since=str(data.get("since", "")),
                       renewed=float(data.get("renewed", 0.0)), ttl_s=float(data.get("ttl_s", TTL_S)))
        except (KeyError, TypeError, ValueError):
            return None

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def renew(self) -> Holder:
        return replace(self, renewed=time.time())

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname() and self.boot_id == _boot_id()

    def alive(self) -> bool:
        if self.host == socket.gethostname() and self.boot_id and self.boot_id != _boot_id():
            return False   # this host's, from before a reboot
        if self.on_this_host():
            started = _start_time(self.pid)
            if started is None:
                return False
            return self.started is None or abs(started - self.started) < _START_TOLERANCE_S
        return time.time() < self.renewed + self.ttl_s

    def describe(self) -> str:
        """``pid 4904 on host h (`gnnpipe run --set epochs=300`), since 2026-11-26 06:50:01 UTC``"""
        since = self.since.replace("T", " ").replace("+00:00", " UTC")
        command = f" (`{self.command}`)" if self.command else ""
        return f"pid {self.pid} on host {self.host}{command}, since {since}"
