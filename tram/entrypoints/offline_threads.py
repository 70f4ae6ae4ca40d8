"""The offline `LLM`'s CPU threads and OpenMP wait policy: the planner's rules (tram/executor/cpu_threads.py)
applied in the user's own process, where the in-process engine runs the model.

Two moments. libgomp (shared by torch, MKL and Tram's C++ kernels) reads OMP_WAIT_POLICY and
GOMP_SPINCOUNT once, when torch loads it: importing this module, which tram/entrypoints/llm.py does
before anything that imports torch, loads torch with Tram's short spin in the environment and then
takes the variable out again, so that the processes the user starts later inherit the environment
they had. Where torch (or anything else that links libgomp) loaded first, that moment has passed:
`apply` then warns with the fix when it matters. The thread count can change at any time
(torch.set_num_threads), so `apply` sets it when an `LLM` is built, from the environment as it is then,
unless the program set torch's count itself after importing Tram (TorchThreads).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tram.executor import cpu_share
from tram.executor.cpu_threads import (
    THREADS_VARS,
    CpuThreadPolicy,
    choose_cpu_threads,
    environment,
    late_wait_policy,
    late_wait_warning,
    omp_runtime_loaded,
    usable_cores,
    wait_env,
)

if TYPE_CHECKING:
    from tram.config import EngineConfig

logger = logging.getLogger(__name__)

# Offline there is no API server; the core left over is for whatever else runs on the machine, because
# an OpenMP region ends only when its slowest thread does, and a thread that lost its core to another
# process stalls every region (docs/benchmarks.md, "The offline API on a busy machine").
SPARE_FOR = "other processes"
_warned: set[str] = set()


def _load_torch() -> bool:
    """Import torch with Tram's wait variables in the environment (none where the user set theirs);
    False where libgomp had loaded already, so that it waits as it read then."""
    if "torch" in sys.modules or omp_runtime_loaded():
        return False
    with environment(wait_env(os.environ)):
        import torch  # noqa: F401  (libgomp reads the wait variables now, and only now)
    return True


@dataclass
class TorchThreads:
    """torch's thread count as this module found it, and as the last `LLM` set it: a count that is
    neither when an `LLM` is built was the program's own torch.set_num_threads, which it keeps."""

    found: int
    ours: int | None = None

    def programs_choice(self, now: int) -> int | None:
        return now if now not in (self.found, self.ours) else None


def _found_threads() -> TorchThreads:
    import torch

    return TorchThreads(torch.get_num_threads())


# At import, before tram/entrypoints/llm.py imports anything that imports torch.
LOADED_HERE = _load_torch()
TORCH_THREADS = _found_threads()


def plan(
    environ: Mapping[str, str], cores: int, loaded_here: bool, programs_threads: int | None = None
) -> CpuThreadPolicy:
    """The in-process model's policy: the planner's, with the thread count the program gave torch
    where it set one and no variable says otherwise, and libgomp's default wait where a spin count
    Tram would add came too late (libgomp loaded before this module: `loaded_here` False)."""
    policy = choose_cpu_threads(environ, cores, SPARE_FOR)
    if programs_threads is not None and not policy.threads_source.startswith(THREADS_VARS):
        policy = dataclasses.replace(
            policy,
            threads=programs_threads,
            threads_source=f"torch.set_num_threads({programs_threads}) by this program",
            shared_threads=None,
        )
    if policy.env and not loaded_here:
        return late_wait_policy(policy)
    return policy


def apply(config: EngineConfig) -> CpuThreadPolicy | None:
    """Give this process's torch the planner's threads when the model runs here on the CPU (its
    device resolved); log the choice, and warn once with the fix where threads spin at libgomp's default.
    None where the model's threads are not this process's: on a GPU, or in ranks of their own (the
    executor plans theirs)."""
    if config.model_config.device_type != "cpu" or config.parallel_config.world_size > 1:
        cpu_share.uninstall()  # an earlier CPU LLM's watch must not set this one's threads
        return None
    import torch

    programs = TORCH_THREADS.programs_choice(torch.get_num_threads())
    policy = plan(os.environ, usable_cores(), LOADED_HERE, programs)
    if policy.shared_threads is not None:
        cpu_share.install(policy.threads, policy.shared_threads, (os.getpid(),), torch.set_num_threads)
    else:
        cpu_share.uninstall()
        torch.set_num_threads(policy.threads)
    TORCH_THREADS.ours = policy.threads
    logger.info("LLM: %s", policy.describe())
    warning = late_wait_warning(policy)
    if warning is not None and warning not in _warned:
        _warned.add(warning)
        logger.warning(warning)
    return policy
