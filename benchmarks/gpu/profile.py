"""Where a decode step's time goes: torch.profiler over a few engine steps, the kernels that took the
most device time, and how much of the step's wall time the device was busy at all.

On a GPU the gap between the step's wall time and the device's busy time is the host's share (the
scheduler, input preparation, sampling and output processing not overlapped with the GPU); the top
kernels say which of the rest (GEMMs, attention, elementwise work) to attack first.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from tram.bench.timing import sync

TOP_KERNELS = 15


def _device_us(event: Any, on_device: bool) -> float:
    """An averaged event's self time on the device (or on the CPU when profiling CPU work)."""
    if not on_device:
        return float(event.self_cpu_time_total)
    for name in ("self_device_time_total", "self_cuda_time_total"):  # torch renamed it
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_steps(engine: Any, device: torch.device, steps: int = 3) -> dict[str, Any]:
    """Profile `steps` engine steps: their wall time, the device's busy time (the sum of every
    kernel's self time) and the TOP_KERNELS kernels by self time, all per step."""
    from torch.profiler import ProfilerActivity, profile

    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync(device)
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
    events = [(e.key, e.count, _device_us(e, on_device)) for e in prof.key_averages()]
    # On the CPU every op's self time counts; on a GPU the kernels' (CPU-side ops show no device time).
    busy_ms = sum(us for _, _, us in events) / 1e3 / steps
    top = sorted(events, key=lambda e: -e[2])[:TOP_KERNELS]
    return {
        "steps": steps,
        "wall_ms_per_step": wall_ms,
        "device_busy_ms_per_step": busy_ms,
        "top": [
            {"name": name[:160], "calls_per_step": count / steps, "ms_per_step": us / 1e3 / steps}
            for name, count, us in top
        ],
    }
