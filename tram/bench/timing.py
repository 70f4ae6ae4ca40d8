"""Timing helpers shared by `tram bench` and the scripts in benchmarks/: statistics of measured
durations, and the two ways a micro-benchmark times a call.

- `best_ms`: the minimum over repeats of a loop of calls, for CPU micro-benchmarks on a shared machine
  (other processes only ever make a run slower, so the fastest repeat is the least disturbed).
- `median_ms`: the median of single calls; on CUDA through triton's `do_bench` (CUDA events, L2
  flushed between calls), on the CPU with the host clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def percentile_name(p: float) -> str:
    """The key suffix of a percentile: 99.0 -> 'p99', 99.9 -> 'p99.9' (as vLLM)."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def stats_ms(values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float | None]:
    """Mean, median, std and linear-interpolated percentiles in ms; None for each when there are no values."""
    keys = ["mean", "median", "std", *(percentile_name(p) for p in percentiles)]
    if len(values_s) == 0:
        return dict.fromkeys(keys)
    a = np.asarray(values_s, dtype=float) * 1000.0
    out: dict[str, float | None] = {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std())}
    for p in percentiles:
        out[percentile_name(p)] = float(np.percentile(a, p))
    return out


def sync(device: Any) -> None:
    """Wait for the device's queued work, so that a host clock read after it measures that work."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def best_ms(fn: Callable[[], object], repeats: int, calls: int) -> float:
    """ms per call: the best of `repeats` loops of `calls` calls, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def median_ms(fn: Callable[[], Any], device: Any, warmup: int = 3, iters: int = 20) -> float:
    """Median time of one call of fn, in ms.

    On CUDA, triton's do_bench: CUDA events per call, L2 flushed before each call (so small problems
    are not timed out of cache), warm-up and repeats in milliseconds of device time (`warmup` and
    `iters` do not apply). On the CPU, `warmup` untimed calls, then the host clock around each of
    `iters` calls.
    """
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
