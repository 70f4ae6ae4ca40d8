"""Every environment variable Tram reads, declared once: its name, default and meaning (as vLLM's envs.py).

Read one as an attribute, `envs.TRAM_CPU_KERNELS`: the value is read from os.environ at that moment,
never cached at import, because tests monkeypatch the environment and a spawned process inherits the
one its parent has when it starts. `read(name, environ)` reads another mapping (the CPU-thread planner
decides for an environment it was handed). README.md's "Environment variables" table lists the same.

The rules are shared: an empty value (or one of spaces) counts as unset; a switch that is on by
default is off only at "0", and one that is off by default is on only at "1". A leaf module: it
imports nothing of Tram's, so any floor may read through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


@dataclass(frozen=True)
class EnvVar:
    """One variable: `parse` turns its (stripped, non-empty) text into the value; unset gives `default`.
    `reader` says who reads it when that is not Tram itself (the benchmarks, the tests)."""

    name: str
    default: Any
    meaning: str
    parse: Callable[[str], Any] = str
    reader: str = "tram"

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        text = (os.environ if environ is None else environ).get(self.name, "").strip()
        return self.parse(text) if text else self.default


def _on_unless_0(text: str) -> bool:
    return text != "0"


def _off_unless_1(text: str) -> bool:
    return text == "1"


def _cache(*parts: str) -> Path:
    return Path.home().joinpath(*parts)


_DECLARED = (
    # ---- the model's CPU threads (the planner: tram/executor/cpu_threads.py) ----
    EnvVar(
        "TRAM_CPU_THREADS",
        None,
        "the model's CPU threads, per engine core (so per data-parallel replica), per rank and for the "
        "offline LLM; unset: every usable core while no other process is busy, one fewer while one is "
        "(tram/executor/cpu_share.py), and shares of the cores but one among replicas and ranks",
    ),
    EnvVar("OMP_NUM_THREADS", None, "OpenMP's thread count; Tram takes it for TRAM_CPU_THREADS when that is unset"),
    EnvVar("OMP_WAIT_POLICY", None, "OpenMP's wait policy (ACTIVE / PASSIVE); when set, Tram sets no spin count"),
    EnvVar(
        "GOMP_SPINCOUNT",
        None,
        "libgomp's spins before a waiting thread sleeps; default: Tram sets 3000 for the engine "
        "core and its ranks, and for the offline LLM when it loads torch first (unless OMP_WAIT_POLICY is set)",
    ),
    # ---- CPU kernels and memory ----
    EnvVar("TRAM_CPU_KERNELS", True, "0 switches the C++ CPU kernels off (pure PyTorch paths)", _on_unless_0),
    EnvVar("TRAM_CPU_MARCH", "native", "the -march the C++ CPU kernels are built for (e.g. x86-64-v3)"),
    EnvVar("TRAM_CPU_AMX", True, "0 keeps the K-quant GEMM and bf16 experts off AMX tiles", _on_unless_0),
    EnvVar("TRAM_CPU_PACKED_LINEAR", True, "0 keeps linear weights unpacked (no oneDNN blocked layout)", _on_unless_0),
    EnvVar(
        "TRAM_CPU_DECODE_PROGRAM",
        True,
        "0 runs decode steps through the modules instead of each layer's kernels chosen once (layers/cpu_decode.py)",
        _on_unless_0,
    ),
    EnvVar(
        "TRAM_CPU_PAIR_LINEAR",
        True,
        "0 keeps a bf16 LM head in oneDNN's layout where it would be packed in pairs of k (AVX512-BF16 without AMX)",
        _on_unless_0,
    ),
    EnvVar(
        "TRAM_CPU_PAIR_COPIES",
        1 / 16,
        "the most of physical memory (a fraction) the layers' bf16 weights may take again as copies in pairs of k "
        "for a decode step's rows, beside oneDNN's (AVX512-BF16 without AMX); 0 keeps oneDNN's alone",
        float,
    ),
    EnvVar(
        "TRAM_GGUF_REPACK",
        True,
        "0 keeps GGUF Q4_K and Q6_K weights in the file's layout under --gguf-activations int8 (no x8 repack at load)",
        _on_unless_0,
    ),
    EnvVar(
        "TRAM_SPEC_DRAFT_SWITCH",
        True,
        "0 verifies the proposer's drafts at every batch size (no switching to plain decoding where drafting "
        "measured slower); the tests use it so that drafting never depends on timing",
        _on_unless_0,
    ),
    EnvVar(
        "TRAM_CPU_MALLOC_TUNING",
        True,
        "0 keeps glibc's malloc thresholds (no mallopt tuning in the worker)",
        _on_unless_0,
    ),
    EnvVar(
        "TRAM_CPU_KVCACHE_SPACE",
        None,
        "the CPU KV cache budget per rank in GiB (as vLLM's VLLM_CPU_KVCACHE_SPACE, read when this is unset); "
        "unset or 0: 4 GiB, at most half the memory available at start; what the requests can use is the most "
        "reserved, and pages are only taken as blocks are first written",
        float,
    ),
    EnvVar(
        "VLLM_CPU_KVCACHE_SPACE", None, "vLLM's name for TRAM_CPU_KVCACHE_SPACE, honoured for users switching", float
    ),
    # ---- distributed ----
    EnvVar(
        "TRAM_TP_SHM",
        True,
        "0 makes CPU tensor-parallel ranks of one node all-reduce with gloo instead of shared memory",
        _on_unless_0,
    ),
    # ---- logging and the server ----
    EnvVar(
        "TRAM_CONFIGURE_LOGGING",
        True,
        "0 leaves logging to the application (no handler on the 'tram' logger)",
        _on_unless_0,
    ),
    EnvVar("TRAM_LOGGING_LEVEL", "INFO", "the level of the 'tram' logger"),
    EnvVar("TRAM_SERVER_DEV_MODE", False, "1 adds the server's endpoints for tests and debugging", _off_unless_1),
    EnvVar(
        "TRAM_API_KEY",
        None,
        "the default of `--api-key`",
        reader="ServerArgs' own declaration, as tram/config imports nothing of Tram's",
    ),
    # ---- benchmarks and tests ----
    EnvVar(
        "TRAM_BENCH_CACHE",
        _cache(".cache", "tram", "checkpoints"),
        "where `tram bench` keeps the presets' random-weight checkpoints",
        Path,
    ),
    EnvVar(
        "TRAM_VLLM_VENV",
        _cache(".venvs", "vllm-cpu"),
        "the virtual environment of vLLM's CPU build (`tram bench throughput --backend vllm`)",
        Path,
    ),
    EnvVar(
        "TRAM_VLLM_CACHE",
        _cache(".cache", "tram", "vllm-peer"),
        "benchmarks/vllm_cpu_peer.py's results and logs",
        Path,
        reader="benchmarks",
    ),
    EnvVar(
        "TRAM_LLAMA_CPP_CACHE",
        _cache(".cache", "tram", "llama.cpp"),
        "where the llama.cpp build (and its GGUF tools) lives",
        Path,
        reader="benchmarks, tests",
    ),
    EnvVar(
        "TRAM_GGUF_MODEL_CACHE",
        _cache(".cache", "tram", "gguf-models"),
        "where the tests keep real GGUF model files fetched from the package index (and transformers' answers on them)",
        Path,
        reader="tests",
    ),
    EnvVar(
        "TRAM_LLAMA_CPP_MARCH",
        None,
        "the -march of benchmarks/llama_cpp_peer.py's llama.cpp build (default: this CPU)",
        reader="benchmarks",
    ),
    EnvVar(
        "TRAM_FUZZ_EXPLORE",
        False,
        "1 lets the OpenAPI fuzz test draw new cases (default: the derandomized ones)",
        _off_unless_1,
        reader="tests",
    ),
)

VARIABLES: dict[str, EnvVar] = {v.name: v for v in _DECLARED}

if TYPE_CHECKING:  # what attribute access returns, for type checkers
    TRAM_CPU_THREADS: str | None
    OMP_NUM_THREADS: str | None
    OMP_WAIT_POLICY: str | None
    GOMP_SPINCOUNT: str | None
    TRAM_CPU_KERNELS: bool
    TRAM_CPU_MARCH: str
    TRAM_CPU_AMX: bool
    TRAM_CPU_PACKED_LINEAR: bool
    TRAM_CPU_DECODE_PROGRAM: bool
    TRAM_CPU_PAIR_LINEAR: bool
    TRAM_CPU_PAIR_COPIES: float
    TRAM_GGUF_REPACK: bool
    TRAM_SPEC_DRAFT_SWITCH: bool
    TRAM_CPU_MALLOC_TUNING: bool
    TRAM_CPU_KVCACHE_SPACE: float | None
    VLLM_CPU_KVCACHE_SPACE: float | None
    TRAM_TP_SHM: bool
    TRAM_CONFIGURE_LOGGING: bool
    TRAM_LOGGING_LEVEL: str
    TRAM_SERVER_DEV_MODE: bool
    TRAM_API_KEY: str | None
    TRAM_BENCH_CACHE: Path
    TRAM_VLLM_VENV: Path
    TRAM_VLLM_CACHE: Path
    TRAM_LLAMA_CPP_CACHE: Path
    TRAM_GGUF_MODEL_CACHE: Path
    TRAM_LLAMA_CPP_MARCH: str | None
    TRAM_FUZZ_EXPLORE: bool


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Variable `name`'s value in `environ` (os.environ by default), or its default when unset."""
    return VARIABLES[name].read(environ)


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return VARIABLES[name].read()
    raise AttributeError(f"module 'tram.envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])
