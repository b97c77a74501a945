"""A compact ``torch.profiler`` summary of some training batches, for the benchmarks' JSON (issue [4/5] item 3: the
profile before and after). What it keeps, per batch: device kernel time and the device's busy share of the wall
time, kernel launches, host-device synchronisations and copies, and the heaviest kernels and host ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# runtime calls counted per batch: launches, the ways the host waits on the device, and copies
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                 "cudaEventSynchronize", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaHostAlloc", "cudaMalloc")


def _device_us(event: Any) -> float:
    # torch >= 2.4 names it self_device_time_total; older builds self_cuda_time_total
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))


def profile_batches(run: Callable[[], tuple[float, int]], *, cuda: bool, top: int = 10) -> dict[str, Any]:
    """Profile ``run()``, which trains some batches and returns (wall seconds, batches); the summary per batch."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        wall_s, batches = run()
    events = prof.key_averages()
    # device-side ranges of record_function (DDP's forward, the optimiser's step) span kernels counted on their own
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]
    kernel_us = sum(_device_us(e) for e in kernels)
    calls = {e.key: e.count for e in events if e.key in RUNTIME_CALLS}
    per = max(batches, 1)
    return {
        "batches": batches, "ms_per_batch": round(wall_s * 1e3 / per, 2),
        "kernel_ms_per_batch": round(kernel_us / 1e3 / per, 2),
        "device_busy": round(kernel_us / 1e6 / wall_s, 3) if wall_s > 0 else None,
        "kernels_per_batch": round(sum(e.count for e in kernels) / per, 1),
        "runtime_calls_per_batch": {k: round(v / per, 1) for k, v in sorted(calls.items())},
        "top_kernels_ms_per_batch": {e.key[:80]: round(_device_us(e) / 1e3 / per, 3)
                                     for e in sorted(kernels, key=_device_us, reverse=True)[:top]},
        "top_host_ops_ms_per_batch": {e.key[:80]: round(e.self_cpu_time_total / 1e3 / per, 3)
                                      for e in sorted(events, key=lambda e: e.self_cpu_time_total,
                                                      reverse=True)[:top]},
    }
