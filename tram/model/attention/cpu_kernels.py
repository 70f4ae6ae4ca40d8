"""CPU attention kernels in C++, compiled just in time.

Why: on CPU, decode attention dominated the step. The pure-PyTorch path gathers every decode's
K/V through its block table into a padded [B, Hkv, max_len, D] tensor and runs one masked SDPA,
so each K/V byte is read, written, and read again, plus the work on padding. The kernel in
csrc/paged_decode.cpp reads K/V rows straight from the paged cache, once, with an exact two-pass
softmax in float32 (see the file's header for the details).

The extension is built with torch.utils.cpp_extension.load on first use (needs g++ and ninja),
once per process; torch caches the build under its extensions directory (TORCH_EXTENSIONS_DIR,
default ~/.cache/torch_extensions), keyed by source and flags, so later processes only load it.
It is compiled with -march=native, so the module name carries a hash of the CPU's features and a
cache shared between different machines never hands one a binary for another.

If the build fails, or TRAM_CPU_ATTENTION_KERNEL=0, `load_cpu_kernels()` returns None (a warning
is logged once on failure) and callers keep the pure-PyTorch path.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "paged_decode.cpp")
# -fopenmp: at::parallel_for is header code that only runs in parallel when compiled with OpenMP
# (the extension then shares the libgomp torch already loaded). No -ffast-math: the kernel's loops
# are written to vectorise without it (omp simd reductions, a polynomial exp).
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-DNDEBUG"]
_LDFLAGS = ["-fopenmp"]
ENV_SWITCH = "TRAM_CPU_ATTENTION_KERNEL"
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_lock = threading.Lock()
_loaded = False
_module: ModuleType | None = None


def _cpu_tag() -> str:
    """A short hash of the CPU's instruction-set features (the build uses -march=native)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    key = f"{platform.machine()}|{platform.processor()}|{flags}"
    return hashlib.sha1(key.encode()).hexdigest()[:10]


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    return load(
        name=f"tram_cpu_attention_{_cpu_tag()}",
        sources=[_SOURCE],
        extra_cflags=list(_CFLAGS),  # copies: load() appends to extra_ldflags in place
        extra_ldflags=list(_LDFLAGS),
        verbose=False,
    )


def load_cpu_kernels() -> ModuleType | None:
    """The compiled extension, built on the first call of the process; None when disabled or unbuildable."""
    global _loaded, _module
    if _loaded:
        return _module
    with _lock:
        if _loaded:
            return _module
        if os.environ.get(ENV_SWITCH, "1").strip() == "0":
            logger.info("CPU attention kernel disabled by %s=0; using the PyTorch path", ENV_SWITCH)
            _module = None
        else:
            try:
                _module = _build()
            except Exception as exc:  # compiler missing, build error, bad flags on this CPU...
                logger.warning("CPU attention kernel unavailable (%s: %s); using the PyTorch path",
                               type(exc).__name__, exc)
                _module = None
        _loaded = True
        return _module


def cpu_kernels_available() -> bool:
    """True when the C++ kernels are (or can now be) built and loaded in this process."""
    return load_cpu_kernels() is not None


def paged_decode_attention(
    query: torch.Tensor,  # [B, H, D], any strides
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D], contiguous, query's dtype
    block_tables: torch.Tensor,  # [B, >= ceil(max seq_len / block_size)] int32 or int64
    seq_lens: torch.Tensor,  # [B] int32 or int64
    scale: float,
    sliding_window: int | None = None,  # None or 0 = no window
) -> torch.Tensor:  # [B, H, D], contiguous, query's dtype
    """Decode attention: query i (at position seq_lens[i] - 1) over its context in the paged cache.

    Attends to positions 0 .. seq_lens[i] - 1, or only the last `sliding_window` of them. Query
    head h reads kv head h // (H // Hkv). Float32 accumulation; CPU tensors only.
    """
    module = load_cpu_kernels()
    if module is None:
        raise RuntimeError(f"CPU attention kernel is not available (disabled by {ENV_SWITCH}=0 or failed to build)")
    return module.paged_decode_attention(query, kv_cache, block_tables, seq_lens, float(scale),
                                         int(sliding_window or 0))


def _reset_for_tests() -> None:
    """Forget the loaded module so that the next load_cpu_kernels() re-reads the environment."""
    global _loaded, _module
    with _lock:
        _loaded, _module = False, None
