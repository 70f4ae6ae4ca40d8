"""CPU memory: glibc malloc settings that keep freed memory in the process for the next step, the
memory the machine has available, and lazily mapped zero tensors for the KV cache.

A step allocates and frees the same activation buffers again and again, most of them between
128 KiB and a few MiB. With glibc's defaults, freed memory at the top of the heap beyond a small
trim threshold goes back to the kernel, and the next step faults every page of it in again: thousands
of minor faults, which slowed a prefill at random whenever a trim had just happened
(docs/benchmarks.md has the faults and timings).
Engines solve this with tcmalloc or jemalloc under LD_PRELOAD; mallopt does it from inside.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import mmap

import torch

import tram.envs as envs

logger = logging.getLogger(__name__)

# From glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc refuses mmap thresholds above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MMAP_THRESHOLD = 32 << 20
# The heap only shrinks when more than this is free at its top: in effect never, so the memory a
# step needed stays mapped (and faulted in) for the next one. Peak use bounds what is kept.
TRIM_THRESHOLD = 1 << 30

_done = False


def keep_freed_memory() -> bool:
    """Apply the settings once per process; False where they do not apply (not glibc, or turned off
    with TRAM_CPU_MALLOC_TUNING=0)."""
    global _done
    if _done:
        return True
    if not envs.TRAM_CPU_MALLOC_TUNING:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # musl, macOS: no mallopt; their allocators behave differently anyway
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        logger.warning("mallopt refused the CPU allocator settings; steps may page-fault more")
        return False
    _done = True
    return True


def mem_available() -> int | None:
    """The kernel's estimate of memory available to new work (MemAvailable), in bytes; None where
    /proc/meminfo is not there."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor in fresh anonymous memory: the kernel maps a page only when it is first
    written, so a large KV cache costs resident memory for the blocks requests have used, not its
    size (torch.zeros writes every page at once)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes)  # zero-filled; the tensor keeps the map alive
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)
