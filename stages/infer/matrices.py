"""Where an inference rank's layer matrices live: in RAM within the rank's host memory budget, memory-mapped past it.

Exact inference holds two layer matrices at a time (``[n_p + H, C]`` float32: ``stages.infer.halo``), and during
layer 0 the rank's features as well when they are in RAM. At 14 M nodes x 128 features on 2 ranks that was
10.8-11.8 GiB of anonymous memory a rank, and the OOM killer ended the job on a 24 GiB host (benchmarks/RESULTS.md
"[2/5] Growth"). ``MatrixSpace`` gives each matrix RAM while the rank's held bytes stay within the budget (the infer
stage's ``host_memory_budget_bytes``, shared with the features read into RAM); a matrix that does not fit is a
memory-mapped file in the job's scratch directory instead. Its pages are page cache: the kernel writes them back and
drops them under memory pressure, which anonymous memory cannot do without swap.

The file's blocks are allocated up front (``posix_fallocate``), so a full disk is an ``OSError`` here, not a SIGBUS
at the first write; and the file is unlinked as soon as it is mapped, so nothing is left on disk whatever ends the
rank (the kernel frees the blocks when the mapping goes).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor


@dataclass
class MatrixSpace:
    """RAM within ``budget_bytes`` (None: no bound, every matrix in RAM), memory-mapped files in ``directory``
    beyond it. ``charge``/``free`` count other large holdings of the rank (its features in RAM) against the same
    budget."""

    budget_bytes: int | None = None
    directory: str | None = None
    held_bytes: int = 0
    peak_held_bytes: int = 0
    mapped_bytes: int = 0          # all matrices ever mapped (bytes written through the page cache)
    mapped_count: int = 0
    _in_ram: dict[int, int] = field(default_factory=dict)   # data_ptr of a matrix in RAM -> its bytes

    def charge(self, nbytes: int) -> None:
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def free(self, nbytes: int) -> None:
        self.held_bytes -= nbytes

    def empty(self, rows: int, cols: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """An uninitialised ``[rows, cols]`` matrix: in RAM when it fits what is left of the budget (or when it is
        empty), else memory-mapped."""
        nbytes = rows * cols * torch.empty(0, dtype=dtype).element_size()
        if nbytes == 0 or self.budget_bytes is None or self.held_bytes + nbytes <= self.budget_bytes:
            out = torch.empty((rows, cols), dtype=dtype)
            if nbytes:
                self._in_ram[out.data_ptr()] = nbytes
                self.charge(nbytes)
            return out
        if self.directory is None:
            raise ValueError("a layer matrix beyond the host memory budget needs a scratch directory")
        self.mapped_bytes += nbytes
        self.mapped_count += 1
        return _mapped(self.directory, rows, cols, dtype, nbytes)

    def release(self, matrix: Tensor) -> None:
        """``matrix`` is no longer used by the caller (its RAM counts no more once it is dropped)."""
        self.free(self._in_ram.pop(matrix.data_ptr(), 0))

    def figures(self) -> dict[str, int | None]:
        return {"budget_bytes": self.budget_bytes, "peak_held_bytes": self.peak_held_bytes,
                "mapped_bytes": self.mapped_bytes, "mapped_matrices": self.mapped_count}


def _mapped(directory: str, rows: int, cols: int, dtype: torch.dtype, nbytes: int) -> Tensor:
    """A ``[rows, cols]`` matrix backed by an unlinked file in ``directory`` (module docstring)."""
    os.makedirs(directory, exist_ok=True)
    fd, path = tempfile.mkstemp(dir=directory, prefix="layer-", suffix=".bin")
    try:
        os.posix_fallocate(fd, 0, nbytes)   # ENOSPC now, rather than a SIGBUS on a later page fault
        array = np.memmap(path, dtype=torch.empty(0, dtype=dtype).numpy().dtype, mode="r+", shape=(rows, cols))
    finally:
        os.close(fd)
        os.unlink(path)
    return torch.from_numpy(array)
