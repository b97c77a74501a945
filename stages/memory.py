"""The preprocessing memory budget: one number every data stage (download, partition, features, hotness) keeps its
peak anonymous memory under, by working in chunks against memory-mapped inputs and spill files on the artifact
root's disk (docs/design.md §2, "The memory budget").

Anonymous memory is what the budget counts: a memory-mapped file's pages are the kernel's page cache, which it
drops under pressure, while heap arrays are not. ``memory_budget_bytes`` (runtime: not in any key, so changing it
never rebuilds an artifact) defaults to ``DEFAULT_SHARE`` of the memory available when the stage starts.

Each stage states its fixed minimum (what it must hold whatever the chunking: O(N) arrays, a partitioner's own
graph); a budget below it fails in one ``error:`` line naming the minimum, before any work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psutil

from storage.errors import InputError

# half of what is available: the other half is the page cache the chunked paths stream through, and whatever else
# runs (a training job beside a preprocessing job on one host)
DEFAULT_SHARE = 0.5
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> object:
    """``4GiB``, ``512MiB``, ``8G``, ``1.5e9`` or an int → int bytes; anything else is returned for pydantic to
    reject with the field's own message."""
    if isinstance(value, str):
        match = _SIZE.match(value.replace("_", ""))
        if match and match.group(2).lower() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
        try:
            return int(float(value))
        except ValueError:
            return value
    return value


def gib(n: float) -> str:
    """Bytes as people read them in an error line: ``1.25 GiB``, ``300 MiB``."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class MemoryBudget:
    """A stage's budget in bytes, and where it came from (for the report)."""

    bytes: int
    stage: str
    source: str   # "memory_budget_bytes" or "50 % of the 11.8 GiB available"

    @classmethod
    def resolve(cls, value: int | None, stage: str) -> MemoryBudget:
        if value is not None:
            return cls(int(value), stage, "memory_budget_bytes")
        available = int(psutil.virtual_memory().available)
        return cls(int(DEFAULT_SHARE * available), stage,
                   f"{100 * DEFAULT_SHARE:.0f} % of the {gib(available)} available")

    def require(self, minimum: int, what: str) -> None:
        """Fail in one line when the stage's fixed ``minimum`` (``what`` it is, in words) exceeds the budget."""
        if minimum > self.bytes:
            raise InputError(f"{self.stage} needs at least {gib(minimum)} of memory for {what}, more than "
                             f"memory_budget_bytes={self.bytes} ({gib(self.bytes)}, {self.source}); raise "
                             f"memory_budget_bytes to {minimum} or more")

    def share(self, slots: int, minimum: int, what: str) -> MemoryBudget:
        """Each of ``slots`` units' budget (``stages.executor``: a worker slot runs one unit at a time, and
        ``dask[:N]`` puts every slot on this host), each unit holding ``minimum`` (``what``) itself: checked as
        ``slots`` × ``minimum`` against the whole budget, so the error line names the ``memory_budget_bytes`` to set
        (a share's own minimum would be ``slots`` times too low)."""
        if slots == 1:
            self.require(minimum, what)
            return self
        self.require(slots * minimum, f"{slots} units that each hold {what}")
        return MemoryBudget(self.bytes // slots, self.stage, f"1/{slots} of {self.describe()}")

    def fits(self, need: int) -> bool:
        """Whether an in-memory path needing ``need`` bytes stays within the budget."""
        return need <= self.bytes

    def describe(self) -> str:
        return f"{gib(self.bytes)} ({self.source})"
