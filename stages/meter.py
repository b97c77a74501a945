"""Wall time and peak memory of a piece of work, for the stage reports and benchmarks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil


def _reset_kernel_peak() -> bool:
    """Reset the kernel's high-water mark of this process's RSS (Linux: clear_refs 5); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A kB field of ``/proc/<pid>/status`` (``VmHWM``, ``RssAnon``) in bytes; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _kernel_peak() -> int | None:
    return _status_bytes("VmHWM")


def anon_rss_bytes(pid: int | str = "self") -> int | None:
    """Resident anonymous memory (``RssAnon``) of a process: heap arrays, not the page cache of mapped files, which
    is what ``memory_budget_bytes`` bounds (``stages.memory``); None where /proc does not say."""
    return _status_bytes("RssAnon", pid)


@contextmanager
def measure(interval_s: float = 0.05) -> Iterator[dict[str, Any]]:
    """Yield a dict that holds ``wall_s`` and ``peak_rss_bytes`` (this process) once the block ends.

    ``ru_maxrss`` is the process's lifetime peak, which says nothing about one stage of a long flow. On Linux the
    kernel's high-water mark is reset at the start and read at the end (exact, even while a C extension such as
    METIS holds the GIL); elsewhere a thread samples RSS. ``peak_anon_bytes`` (Linux) is sampled by that thread
    every ``interval_s``: the kernel keeps no high-water mark of anonymous memory alone, and a C call that holds
    the GIL for long hides its peak from the thread (``benchmarks/bench_scale.py`` samples from outside instead).
    """
    proc = psutil.Process()
    result: dict[str, Any] = {"start_rss_bytes": proc.memory_info().rss}
    exact = _reset_kernel_peak()
    peak = [result["start_rss_bytes"]]
    anon = [anon_rss_bytes()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            if not exact:
                peak[0] = max(peak[0], proc.memory_info().rss)
            if anon[0] is not None:
                anon[0] = max(anon[0], anon_rss_bytes() or 0)

    thread = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    start = time.perf_counter()
    if not exact or anon[0] is not None:
        thread.start()
    try:
        yield result
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        kernel = _kernel_peak() if exact else None
        result["wall_s"] = round(time.perf_counter() - start, 3)
        result["peak_rss_bytes"] = int(max(peak[0], kernel or 0))
        result["peak_rss_source"] = "kernel VmHWM" if kernel else "sampled"
        if anon[0] is not None:
            result["peak_anon_bytes"] = int(max(anon[0], anon_rss_bytes() or 0))
