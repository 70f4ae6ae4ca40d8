"""The one CPU-thread planner: how many threads the model gets (the engine core's, each data-parallel
replica's share, each rank's share under tensor/pipeline parallelism, mp or Ray) and how its OpenMP
threads wait. Everyone who starts a process that runs the model asks here.

Torch-free: the API server decides the OpenMP wait policy before it spawns the engine core, because
libgomp (shared by torch, MKL and Tram's C++ kernels) reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once,
when it loads with torch, and the spawned engine imports torch while it unpickles its arguments
(the model config loads transformers), before any code of ours runs there. The engine core then
computes the thread count from the same environment with the same function.

The rules (docs/benchmarks.md, "Sharing the machine", has the measurements behind them):
- Threads: TRAM_CPU_THREADS, else OMP_NUM_THREADS, else every usable core while other processes
  leave them free and one core less while one is busy (tram/executor/cpu_share.py watches). An
  OpenMP parallel region ends only when its slowest thread does, so when any other process takes a
  core from one of the engine's threads, every region waits for that thread to be scheduled again:
  with one busy process beside the server, a thread on every core makes the time between tokens
  many times worse at its tail and lowers throughput, where on a free machine the last core is
  worth 1.3-1.6x on a 2-core one.
- Waiting (for teams of 2+ threads): libgomp's default spins 300,000 times at the end of every
  parallel region before it sleeps; a spin is a PAUSE instruction, tens of nanoseconds on recent
  CPUs, so that is milliseconds, longer than a scheduler time slice, burnt on a core that another process (often the
  very thread being waited for) needs. Tram sets a short spin instead (DEFAULT_SPIN_COUNT). A user's
  OMP_WAIT_POLICY or GOMP_SPINCOUNT is never overridden: either one means the user chose.
- Shares: a data-parallel replica gets an even share of the cores but one; a replica's ranks split
  its share (or the cores) evenly; a thread count the user set is per replica and per rank.

The offline `LLM` runs the model in the user's own process, and follows the same rules there (a
busy process beside it hurts it exactly as it hurts the engine core; docs/benchmarks.md, "The
offline API on a busy machine"): tram/entrypoints/offline_threads.py loads torch with the short spin
when it can, sets the thread count when the `LLM` is built, and where libgomp loaded before Tram
could act (torch imported first) and a team of 2+ threads would spin at libgomp's default, it warns
with the fix (late_wait_warning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import tram.envs as envs

THREADS_VARS = ("TRAM_CPU_THREADS", "OMP_NUM_THREADS")  # in order of precedence
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# About a tenth of a millisecond of spinning. Beside a busy process the time between tokens grows
# with the spin count, so it is short; alone, this keeps the default's speed, where not spinning at all
# (PASSIVE) pays a futex wake-up per parallel region.
DEFAULT_SPIN_COUNT = 3_000
# libgomp's own, with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set.
LIBGOMP_SPIN_COUNT = 300_000


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
    # The default's count while another process is busy (`threads` is the count while none is);
    # None where the count is fixed (the user's, a replica's share, a single core).
    shared_threads: int | None = None

    def describe(self) -> str:
        return (
            f"{self.threads} CPU thread(s) for the model ({self.threads_source}; TRAM_CPU_THREADS to change); "
            f"OpenMP threads wait with {self.wait}"
        )


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _user_set_threads(environ: Mapping[str, str]) -> bool:
    return any(envs.read(name, environ) is not None for name in THREADS_VARS)


def _thread_count(environ: Mapping[str, str], cores: int, spare_for: str) -> tuple[int, str, int | None]:
    """(threads, why, threads while another process is busy: None where fixed)."""
    for name in THREADS_VARS:
        value = envs.read(name, environ)  # stripped; None where unset or empty
        if value is not None:
            try:
                return max(1, int(value)), f"{name}={value}", None
            except ValueError:
                raise ValueError(f"{name} must be a whole number of threads, got {value!r}") from None
    if cores <= 1:
        return 1, "default: the one usable core", None
    return (
        cores,
        f"default: all {cores} usable cores while other processes leave them free, "
        f"{cores - 1} while one is busy, leaving a core to {spare_for}",
        cores - 1,
    )


def _user_wait(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k in WAIT_VARS if (v := envs.read(k, environ)) is not None}


def wait_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The wait variables Tram adds for a libgomp that loads with `environ`: none where the user set either."""
    return {} if _user_wait(environ) else {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}


def choose_cpu_threads(environ: Mapping[str, str], cores: int, spare_for: str = "the API server") -> CpuThreadPolicy:
    """The policy for an engine core started with `environ` on a machine with `cores` usable cores;
    `spare_for` says who the core left over is for (in the log line)."""
    threads, source, shared = _thread_count(environ, cores, spare_for)
    user_wait = _user_wait(environ)
    if user_wait:
        wait = ", ".join(f"{k}={v}" for k, v in user_wait.items()) + " (set by the user)"
        return CpuThreadPolicy(threads, source, {}, wait, shared)
    return CpuThreadPolicy(
        threads,
        source,
        wait_env(environ),
        f"GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT} (Tram's default; set OMP_WAIT_POLICY or GOMP_SPINCOUNT to change)",
        shared,
    )


def engine_core_policy(environ: Mapping[str, str], cores: int, replica_threads: int | None) -> CpuThreadPolicy:
    """The engine core's policy; a data-parallel replica runs its share (`replica_threads`) instead."""
    policy = choose_cpu_threads(environ, cores)
    if replica_threads is None:
        return policy
    return dataclasses.replace(
        policy,
        threads=replica_threads,
        threads_source=f"this replica's share: {replica_threads}",
        shared_threads=None,
    )


def replica_threads(environ: Mapping[str, str], cores: int, size: int) -> int | None:
    """A replica's CPU threads: None where the user set them (per replica, or per rank under TP);
    else an even share of the cores but one (the API server's), at least one."""
    if _user_set_threads(environ):
        return None
    return max(1, (cores - 1) // size)


def rank_threads(
    environ: Mapping[str, str], cores: int, world_size: int, replica_threads: int | None = None
) -> tuple[int, dict[str, str]]:
    """Each rank's CPU threads and the variables added to its environment (mp executor). TRAM_CPU_THREADS
    (or OMP_NUM_THREADS) is per rank; by default the usable cores (or a data-parallel replica's share of
    them) are split evenly, at least one each, so ranks never oversubscribe the machine."""
    policy = choose_cpu_threads(environ, cores)
    explicit = _user_set_threads(environ)
    pool = cores if replica_threads is None else replica_threads
    threads = policy.threads if explicit else max(1, pool // world_size)
    return threads, {**policy.env, "OMP_NUM_THREADS": str(threads)}


def ray_rank_threads(environ: Mapping[str, str], replica_threads: int | None, world_size: int) -> int:
    """A Ray rank's CPU threads (and Ray CPUs): TRAM_CPU_THREADS per rank, else the data-parallel
    replica's share split over its ranks, else one. Ray places ranks before we know their nodes,
    so the default cannot be each node's cores."""
    explicit = envs.read("TRAM_CPU_THREADS", environ)
    if explicit is not None:
        return max(1, int(explicit))
    return max(1, (replica_threads or 1) // world_size)


def omp_runtime_loaded(maps_path: str = "/proc/self/maps") -> bool:
    """Whether a libgomp that torch would share is mapped into this process already: it read its wait
    variables when it loaded, so setting them now changes nothing. A copy renamed by its wheel
    (sentencepiece's libgomp-6a29c32d.so.1.0.0) is that wheel's own, and torch loads its libgomp.so.1
    beside it. False where the maps cannot be read (not Linux)."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as f:
            return any(os.path.basename(line.split()[-1]).startswith("libgomp.so") for line in f if line.strip())
    except OSError:
        return False


def late_wait_policy(policy: CpuThreadPolicy) -> CpuThreadPolicy:
    """`policy` for a process whose libgomp loaded before Tram could add its spin count: the
    threads wait with libgomp's own default, whatever `policy.env` says."""
    return dataclasses.replace(
        policy, env={}, wait=f"libgomp's default, GOMP_SPINCOUNT={LIBGOMP_SPIN_COUNT} (torch was loaded before Tram)"
    )


def late_wait_warning(policy: CpuThreadPolicy) -> str | None:
    """The warning, with the fix, for a team of 2+ threads that spins at libgomp's default because
    torch loaded before Tram (None when there is nothing to fix: one thread waits for nobody, and a
    user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is the user's choice)."""
    # The default gives a core up while another process is busy: only a team that stays 2+ then spins
    # beside it.
    team = policy.threads if policy.shared_threads is None else policy.shared_threads
    if team < 2 or not policy.wait.startswith("libgomp's default"):
        return None
    return (
        f"torch was imported before Tram, so its OpenMP threads ({policy.threads}) spin "
        f"{LIBGOMP_SPIN_COUNT:,} times (milliseconds) before they sleep, burning the cores that other busy "
        "processes need; beside them, generation can be many times slower. Fix: start Python with "
        f"GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT} in the environment (e.g. `GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT} "
        "python app.py`), or import tram's LLM before torch, or set os.environ['GOMP_SPINCOUNT'] = "
        f"'{DEFAULT_SPIN_COUNT}' before the first `import torch`; or use one thread (TRAM_CPU_THREADS=1)."
    )


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
