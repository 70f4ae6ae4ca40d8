"""The C++ CPU kernels (csrc/), compiled just in time into one extension module per family.

Why: on CPU two things dominated a decode step once the batch is small.
  * Decode attention: the pure-PyTorch path gathers every decode's K/V through its block table into
    a padded tensor and runs a masked SDPA. csrc/paged_decode.cpp reads K/V rows straight from the
    paged cache, once, with an exact two-pass softmax in float32.
  * Linear layers with a few rows: PyTorch's gemv reads the weights at a fraction of the memory
    bandwidth. csrc/skinny_linear.cpp streams them on all intra-op threads (see `skinny_linear`).
  * Per-op dispatch: RMSNorm (csrc/rms_norm.cpp, with the residual add fused) and rotary embedding
    (csrc/rotary.cpp, query and key in one call) were some twenty small ops per layer; each is now
    one call with transformers' roundings.

Each family (families.py: core, gguf, quant, moe) is built with torch.utils.cpp_extension.load on
first use (needs g++ and ninja), once per process; torch caches the build under its extensions
directory (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), so later processes only load
it. `load_cpu_kernels()` returns one `CpuKernels` whose attributes are every family's functions.
scripts/setup.sh builds the core family ahead of the first start (`tram build-kernels` builds them
all); a build that happens at start logs its progress (build.py).
It is compiled with -march=native, so the module name carries a hash of the CPU's features (and of
the headers) and a cache shared between different machines never hands one a binary for another.
TRAM_CPU_MARCH names another target (x86-64-v3: AVX2 + FMA, the kernels' floor; x86-64-v4: AVX-512)
for a build that must run on other CPUs than the one building it, or to test one ISA's code on a
CPU that has more.

If the build fails, or TRAM_CPU_KERNELS=0, `load_cpu_kernels()` returns None (a warning is logged
once on failure) and callers keep the pure-PyTorch paths.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import platform
import re
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

import tram.envs as envs
from tram.model.kernels.build import build_in_parallel, build_with_progress
from tram.model.kernels.families import FAMILIES, family_of

logger = logging.getLogger(__name__)

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
# -fopenmp: at::parallel_for is header code that only runs in parallel when compiled with OpenMP
# (the extension then shares the libgomp torch already loaded). No -ffast-math: the kernels' loops
# are written to vectorise without it (vector extensions, omp simd reductions, a polynomial exp).
# -O3, not -O2 (which compiles in a third less time): -O2 leaves the loops over a tile's accumulators
# rolled, so they spill to memory, and runs the prefill attention, int4 linear and norms 3-7x slower.
_CFLAGS = ["-O3", "-fopenmp", "-DNDEBUG"]
_LDFLAGS = ["-fopenmp"]
ENV_SWITCH = "TRAM_CPU_KERNELS"
MARCH_VAR = "TRAM_CPU_MARCH"
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_lock = threading.RLock()
_loaded = False
_module: CpuKernels | None = None


def target_arch() -> str:
    """The -march the kernels are built for: TRAM_CPU_MARCH, else native."""
    march = envs.TRAM_CPU_MARCH
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", march):
        raise ValueError(f"{MARCH_VAR}={march!r} is not a -march name (e.g. native, x86-64-v3, x86-64-v4)")
    return march


def _build_tag() -> str:
    """A short hash of the CPU's instruction-set features and the target (-march), of the source
    folder and of the headers (torch's build cache hashes the sources it is given, not what they
    include)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    # The source folder too: torch's build cache hashes the include paths, so two checkouts on one
    # machine under one module name would rebuild over each other on every start.
    key = f"{platform.machine()}|{platform.processor()}|{flags}|{_CSRC}|{target_arch()}"
    for header in sorted(glob.glob(os.path.join(_CSRC, "*.h"))):
        with open(header) as f:
            key += f.read()
    return hashlib.sha1(key.encode()).hexdigest()[:10]


def extension_name(family: str = "core") -> str:
    """A family's module name, which is also its folder in torch's extension cache."""
    return f"tram_cpu_kernels_{family}_{_build_tag()}"


def compile_family(family: str) -> ModuleType:
    """Build (or load from torch's cache) one family's extension module."""
    from torch.utils.cpp_extension import load

    name = extension_name(family)
    return build_with_progress(
        name,
        lambda: load(
            name=name,
            sources=[os.path.join(_CSRC, source) for source in FAMILIES[family].sources],
            extra_include_paths=[_CSRC],
            extra_cflags=[*_CFLAGS, f"-march={target_arch()}"],  # copies: load() appends to the lists in place
            extra_ldflags=list(_LDFLAGS),
            verbose=False,
        ),
        family,
    )


class CpuKernels:
    """Every family's functions under one name (`kernels.rms_norm`, `kernels.fused_moe`, ...). The
    core family is loaded with it; another builds (or loads from torch's cache) the first time one
    of its functions is looked up, and the function is then kept as an attribute of this object."""

    def __init__(self, core: ModuleType) -> None:
        self._families = {"core": core}
        self._amx: bool | None = envs.TRAM_CPU_AMX
        self.__file__ = core.__file__

    def family(self, name: str) -> ModuleType:
        """The family's extension module, built now if this process has not loaded it yet."""
        module = self._families.get(name)
        if module is None:
            with _lock:
                module = self._families.get(name)
                if module is None:
                    module = compile_family(name)
                    if hasattr(module, "cpu_amx"):
                        module.cpu_amx(self._amx)
                    self._families[name] = module
        return module

    def cpu_amx(self, enable: bool | None = None) -> bool:
        """Allow or forbid AMX tiles in every family with tile code (those loaded now and later), then
        say whether the kernels use them (what the GGUF family's switch says, building it if need be)."""
        if enable is not None:
            self._amx = enable
        holders = [m for m in self._families.values() if hasattr(m, "cpu_amx")] or [self.family("gguf")]
        return [m.cpu_amx(enable) for m in holders][0]

    def __getattr__(self, name: str) -> Any:  # only for names not yet set on the object
        family = family_of(name)
        if family is None or name.startswith("_"):
            raise AttributeError(f"the CPU kernels have no {name!r}")
        function = getattr(self.family(family), name)
        setattr(self, name, function)
        return function


def build_cpu_kernels(families: Sequence[str] = tuple(FAMILIES)) -> CpuKernels:
    """Build (or load the cached builds of) these families now, raising on failure (`tram build-kernels`)."""
    global _loaded, _module
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"no kernel family {unknown}; the families are {sorted(FAMILIES)}")
    build_in_parallel(families)
    with _lock:
        kernels = CpuKernels(compile_family("core"))
        _module, _loaded = kernels, True
    for family in families:
        kernels.family(family)
    return kernels


def kernels_enabled() -> bool:
    return envs.TRAM_CPU_KERNELS


def load_cpu_kernels() -> CpuKernels | None:
    """The compiled kernels (the core family built on the first call of the process, the others on
    first use); None when disabled or unbuildable."""
    global _loaded, _module
    if _loaded:
        return _module
    with _lock:
        if _loaded:
            return _module
        if not kernels_enabled():
            logger.info("CPU kernels disabled by %s=0; using the PyTorch paths", ENV_SWITCH)
            _module = None
        else:
            try:
                _module = CpuKernels(compile_family("core"))
            except Exception as exc:  # compiler missing, build error, bad flags on this CPU...
                logger.warning("CPU kernels unavailable (%s: %s); using the PyTorch paths", type(exc).__name__, exc)
                _module = None
        _loaded = True
        return _module


def kernels_for(x: torch.Tensor) -> CpuKernels | None:
    """The kernels if x may go through them: a CPU tensor of a supported dtype, outside autograd
    (they have no backward); else None."""
    if x.device.type != "cpu" or x.dtype not in SUPPORTED_DTYPES or torch.is_grad_enabled():
        return None
    return load_cpu_kernels()


def cpu_kernels_available() -> bool:
    """True when the C++ kernels are (or can now be) built and loaded in this process."""
    return load_cpu_kernels() is not None


def paged_decode_attention(
    query: torch.Tensor,  # [B, H, D], any strides
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D], contiguous, query's dtype or fp8
    block_tables: torch.Tensor,  # [B, >= ceil(max seq_len / block_size)] int32 or int64
    seq_lens: torch.Tensor,  # [B] int32 or int64
    scale: float,
    sliding_window: int | None = None,  # None or 0 = no window
    k_scale: float = 1.0,  # an fp8 cache's keys are read as stored * k_scale
    v_scale: float = 1.0,
    logits_soft_cap: float | None = None,  # None or 0 = none
    sinks: torch.Tensor | None = None,  # [H] float32: attention sinks (see below)
) -> torch.Tensor:  # [B, H, D], contiguous, query's dtype
    """Decode attention: query i (at position seq_lens[i] - 1) over its context in the paged cache.

    Attends to positions 0 .. seq_lens[i] - 1, or only the last `sliding_window` of them. Query
    head h reads kv head h // (H // Hkv). With logits_soft_cap c, scores become c * tanh(score / c)
    before the softmax. With sinks, head h's softmax denominator also counts exp(sinks[h]) (gpt-oss:
    a logit that takes probability mass and adds no value). Float32 accumulation; CPU tensors only.
    """
    module = load_cpu_kernels()
    if module is None:
        raise RuntimeError(f"CPU kernels are not available (disabled by {ENV_SWITCH}=0 or failed to build)")
    return module.paged_decode_attention(
        query,
        kv_cache,
        block_tables,
        seq_lens,
        float(scale),
        int(sliding_window or 0),
        float(k_scale),
        float(v_scale),
        float(logits_soft_cap or 0.0),
        _sinks_arg(sinks),
    )


def _sinks_arg(sinks: torch.Tensor | None) -> torch.Tensor | None:
    """The kernels read sinks as a contiguous float32 row."""
    return None if sinks is None else sinks.detach().to(torch.float32).contiguous()


def paged_prefill_attention_(
    out: torch.Tensor,  # [T, H, D], contiguous; the requests' rows are written
    query: torch.Tensor,  # [T, H, D], any strides, D % 16 == 0
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D], contiguous, query's dtype or fp8, chunks' K/V in
    block_tables: torch.Tensor,  # [R, >= ceil(max seq_len / block_size)] int32
    query_starts: list[int],  # R first rows in query
    query_lens: list[int],  # R chunk lengths
    seq_lens: list[int],  # R context lengths (cached prefix + chunk)
    scale: float,
    sliding_window: int | None = None,  # None or 0 = no window
    k_scale: float = 1.0,  # an fp8 cache's keys are read as stored * k_scale
    v_scale: float = 1.0,
    logits_soft_cap: float | None = None,  # None or 0 = none
    sinks: torch.Tensor | None = None,  # [H] float32: attention sinks, as paged_decode_attention's
) -> None:
    """Prefill attention: request r's rows query_starts[r] .. + query_lens[r] sit at the last
    query_lens[r] positions of its seq_lens[r]-token context and attend to it causally (csrc/paged_prefill.cpp),
    scores soft-capped (c * tanh(score / c)) when logits_soft_cap is set."""
    module = load_cpu_kernels()
    if module is None:
        raise RuntimeError(f"CPU kernels are not available (disabled by {ENV_SWITCH}=0 or failed to build)")
    module.paged_prefill_attention_(
        out,
        query,
        kv_cache,
        block_tables,
        query_starts,
        query_lens,
        seq_lens,
        float(scale),
        int(sliding_window or 0),
        float(k_scale),
        float(v_scale),
        float(logits_soft_cap or 0.0),
        _sinks_arg(sinks),
    )


def _reset_for_tests() -> None:
    """Forget the loaded module so that the next load_cpu_kernels() re-reads the environment."""
    global _loaded, _module
    with _lock:
        _loaded, _module = False, None


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T + bias for a few rows of x (CPU, float32 or bfloat16; weight [N, K] contiguous).

    Float32 accumulation in an order that depends on neither the number of rows nor the thread count.
    """
    module = load_cpu_kernels()
    if module is None:
        raise RuntimeError(f"CPU kernels are not available (disabled by {ENV_SWITCH}=0 or failed to build)")
    return module.skinny_linear(x, weight, bias)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1) for a 2-D tensor: the C++ kernel for float32 CPU rows (same answer,
    first maximum or first NaN, in one vector pass where torch compares value and index per element),
    torch elsewhere."""
    if logits.dim() == 2 and logits.dtype == torch.float32 and logits.shape[1] > 0:
        module = kernels_for(logits)
        if module is not None:
            return module.argmax_rows(logits)
    return logits.argmax(dim=-1)


def to_float32(x: torch.Tensor) -> torch.Tensor:
    """x.float(): the C++ widening for 16-bit CPU tensors (exact, like the cast, and a plain shift for
    bfloat16; every step of a bf16 model widens its logits), torch elsewhere."""
    if x.dtype == torch.float32:
        return x
    module = kernels_for(x) if x.dtype in (torch.bfloat16, torch.float16) else None
    return module.widen_to_float(x) if module is not None else x.float()
