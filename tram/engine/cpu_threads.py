"""How many CPU threads the engine core's model uses, and how its OpenMP threads wait.

Torch-free: the API server decides the OpenMP wait policy before it spawns the engine core, because
libgomp (shared by torch, MKL and Tram's C++ kernels) reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once,
when it loads with torch, and the spawned engine imports torch while it unpickles its arguments
(the model config loads transformers), before any code of ours runs there. The engine core then
computes the thread count from the same environment with the same function.

The rules, measured on a shared 2-core machine (docs/benchmarks.md, "Sharing the machine"):
- Threads: TRAM_CPU_THREADS, else OMP_NUM_THREADS, else every usable core but one. The API server
  (and often the client, and whatever else runs there) needs a core too. An OpenMP parallel region
  ends only when its slowest thread does, so when any other process takes a core from one of the
  engine's threads, every region waits for that thread to be scheduled again. On 2 cores with one
  busy process beside the server, 2 threads had ~15x the ITL p99 of 1 thread and 1/2.6 of its
  throughput at 16 streams (llama-15m); alone, 2 threads were 0-20% faster on llama-15m, ~1.4x on
  llama-110m, slower on stories260K.
- Waiting (for teams of 2+ threads): libgomp's default spins 300,000 times at the end of every
  parallel region before it sleeps; a spin is a PAUSE instruction, ~31 ns on this AMD EPYC, so that
  is ~10 ms, longer than a scheduler time slice, burnt on a core that another process (often the
  very thread being waited for) needs. Tram sets a short spin instead (DEFAULT_SPIN_COUNT). A user's
  OMP_WAIT_POLICY or GOMP_SPINCOUNT is never overridden: either one means the user chose.

The offline `LLM` runs in the user's process, where torch (and libgomp) is usually loaded before
Tram could act, and where the user owns the threads: it changes neither.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

THREADS_VARS = ("TRAM_CPU_THREADS", "OMP_NUM_THREADS")  # in order of precedence
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# ~0.1 ms of spinning on the 2-core EPYC (libgomp guesses ~0.03 ms). With 2 threads on 2 cores and
# one busy process beside the server, the time between tokens grew with the spin: ~6.5 ms at 0
# (PASSIVE), ~11 at 3,000, ~23 at 10,000, ~55 at 30,000; alone, 3,000 kept the default's speed on
# llama-15m, where PASSIVE cost 40-60% (a futex wake-up per region on a VM).
DEFAULT_SPIN_COUNT = 3_000


@dataclass(frozen=True)
class CpuThreadPolicy:
    """The engine core's model threads and the variables to set in its environment.

    `env` holds only what Tram adds (never a variable the user set); `wait` says how threads wait and
    who chose it, for the log line.
    """

    threads: int
    threads_source: str
    env: dict[str, str] = field(default_factory=dict)
    wait: str = ""

    def describe(self) -> str:
        return (f"{self.threads} CPU thread(s) for the model ({self.threads_source}; TRAM_CPU_THREADS to change); "
                f"OpenMP threads wait with {self.wait}")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _thread_count(environ: Mapping[str, str], cores: int) -> tuple[int, str]:
    for name in THREADS_VARS:
        value = environ.get(name, "").strip()
        if value:
            try:
                return max(1, int(value)), f"{name}={value}"
            except ValueError:
                raise ValueError(f"{name} must be a whole number of threads, got {value!r}") from None
    if cores <= 1:
        return 1, "default: the one usable core"
    return cores - 1, f"default: {cores} usable cores but one, left to the API server"


def choose_cpu_threads(environ: Mapping[str, str], cores: int) -> CpuThreadPolicy:
    """The policy for an engine core started with `environ` on a machine with `cores` usable cores."""
    threads, source = _thread_count(environ, cores)
    user_wait = {k: environ[k] for k in WAIT_VARS if environ.get(k, "").strip()}
    if user_wait:
        wait = ", ".join(f"{k}={v}" for k, v in user_wait.items()) + " (set by the user)"
        return CpuThreadPolicy(threads, source, {}, wait)
    env = {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}
    return CpuThreadPolicy(threads, source, env, f"GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT} (Tram's default; "
                                                 "set OMP_WAIT_POLICY or GOMP_SPINCOUNT to change)")


@contextlib.contextmanager
def environment(updates: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `updates` for the duration (a spawned child inherits it), then as it was."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
