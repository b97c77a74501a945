"""Zero-copy (UVA) access to page-locked host rows from a CUDA device: the GPU gathers rows straight over PCIe.

Two ways to bring a batch's own rows from a pinned host store to the GPU (``DistFeatures``'s ``host_gather``):

- ``copy`` (gather-then-copy): the CPU gathers the rows into a pinned staging buffer (``index_select``, bounded by
  the host's memory bandwidth and threads), then one DMA copies the compact block to the device;
- ``uva`` (zero-copy): the device gathers the rows itself from the pinned store through a device view of its host
  memory (unified virtual addressing), so no CPU pass over the rows and no staging buffer; every row read is a PCIe
  transaction of the row's bytes, so narrow or scattered rows pay PCIe's per-transaction cost.

Which is faster depends on the row width, the batch and the PCIe link: ``benchmarks/bench_gpu_gather.py`` (run by
``make gpu-check``) measures both and the HBM cache beside them. ``auto`` (the default, ``choose_host_gather``)
picks by the row's element width (``UVA_ITEMSIZES``) from two measurements of a 650 k-row batch of 100 columns:

=========  ======================  ======================
element    H200 (issue [4/5])      H100 (gpu-check 2026-11-27)
=========  ======================  ======================
float32    copy 20, UVA 46 GB/s    copy 17.7, UVA 40.3
float16    UVA 29, copy 21         copy 14.9, UVA 27.6
int8       copy 25, UVA 23         copy 18.1, UVA 21.9
=========  ======================  ======================

UVA wins for 2- and 4-byte elements on both; 1-byte rows are a near tie that each card decides its own way (copy
+9 % on the H200, UVA +21 % on the H100), so they keep the copy that the issue chose.

The device view is made with the CUDA array interface: ``torch.as_tensor`` of an object whose
``__cuda_array_interface__`` names the host pointer. CUDA maps ``cudaHostAlloc`` memory (what ``pin_memory``
allocates) into the device's address space under UVA, so the same pointer is valid in device code. The view
shares the host tensor's storage; the host tensor must outlive it (``UvaRows`` holds both).
"""

from __future__ import annotations

import torch
from torch import Tensor

# Element widths (bytes) whose rows the device gathers faster in place than the CPU does into a staging buffer
UVA_ITEMSIZES = frozenset({2, 4})


def choose_host_gather(choice: str, *, device_type: str, itemsize: int, rows_in_ram: bool) -> tuple[str, str]:
    """How a rank's own host rows reach its device: ``(mode, why)``, mode ``copy``, ``uva`` or ``cpu`` (a CPU rank
    reads its rows where they are). ``copy``/``uva`` chosen by the user are kept (``uva`` over rows not in RAM
    fails later, naming the fix); ``auto`` picks by the element width (``UVA_ITEMSIZES``), and ``copy`` for rows
    that stay in Zarr (UVA reads pinned RAM only)."""
    if device_type != "cuda":
        return "cpu", "a CPU rank reads its host rows in place"
    if choice != "auto":
        return choice, "set by host_gather"
    if not rows_in_ram:
        return "copy", "auto: the rows stay in Zarr (over host_memory_budget_bytes); UVA reads pinned RAM only"
    if itemsize in UVA_ITEMSIZES:
        return "uva", f"auto: {itemsize}-byte elements gather faster in place (measured on an H200)"
    return "copy", f"auto: {itemsize}-byte elements gather faster on the CPU (measured on an H200)"


class UvaUnavailableError(RuntimeError):
    """The device cannot read this host tensor in place (no CUDA, not pinned, or the driver refused the pointer)."""


class _HostPointer:
    """A host buffer of ``nbytes`` bytes at ``ptr``, presented to ``torch.as_tensor`` as device-readable memory;
    ``owner`` (the host tensor) lives as long as this object, which the device view holds."""

    def __init__(self, owner: Tensor, nbytes: int) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (owner.data_ptr(), False),
                                         "version": 3, "strides": None}


def device_view(host: Tensor, device: torch.device) -> Tensor:
    """A CUDA tensor of ``host``'s shape and dtype over ``host``'s own memory (pinned, contiguous): what the device
    reads of it crosses PCIe, nothing is copied. The view keeps ``host`` alive."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise UvaUnavailableError(f"zero-copy reads need a CUDA device, not {device}")
    if not host.is_pinned():
        raise UvaUnavailableError("zero-copy reads need page-locked (pinned) host memory")
    if not host.is_contiguous():
        raise UvaUnavailableError("zero-copy reads need a contiguous host tensor")
    if device.index is None:   # "cuda" alone: the current device, by index, to compare the view's with
        device = torch.device("cuda", torch.cuda.current_device())
    if host.numel() == 0:   # no memory to view
        return host.new_empty(host.shape, device=device)
    try:
        flat = torch.as_tensor(_HostPointer(host, host.numel() * host.element_size()), device=device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise UvaUnavailableError(f"the CUDA driver refused a device view of the pinned memory ({err})") from err
    # as_tensor copies instead of viewing when it places the pointer on another device: that would be a silent
    # copy of the whole tensor into device memory, not a zero-copy view
    if flat.device != device or flat.data_ptr() != host.data_ptr():
        raise UvaUnavailableError(f"the pinned memory maps to {flat.device}, not {device}: no in-place view")
    # bytes, reinterpreted in the host dtype: any dtype (bfloat16, float8) without a typestr of its own
    return flat.view(host.dtype).view(host.shape)


class UvaRows:
    """Rows of a pinned host tensor ``[N, F]``, gathered by the device: ``gather(lid)`` with lids on the device."""

    def __init__(self, host: Tensor, device: torch.device) -> None:
        if host.dim() != 2:
            raise UvaUnavailableError("zero-copy gathers need [rows, columns] host rows")
        self.host = host
        self.rows = device_view(host, device)

    def gather(self, lid: Tensor) -> Tensor:
        """``[len(lid), F]`` rows of ``lid`` (int64 on the device), read by the device from host memory."""
        return self.rows.index_select(0, lid)
