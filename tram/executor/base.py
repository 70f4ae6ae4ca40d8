"""What the engine core asks of its executor, whatever runs the ranks."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from tram.config import EngineConfig
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput


class WorkerDiedError(RuntimeError):
    """A rank's process exited or failed: every request in flight fails, and the engine stops."""


class Executor(ABC):
    """Runs the ranks of one model replica.

    `collective_rpc` calls a Worker method on every rank and returns each rank's answer, in rank
    order; `execute_model` runs one step on every rank and returns the output of the last pipeline
    stage's first rank (its tensor-parallel peers sample the same tokens). Both raise WorkerDiedError when a rank is gone; the executor is then unusable.
    """

    world_size: int

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any) -> list[Any]: ...

    @abstractmethod
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput: ...

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every rank; safe to call twice."""

    def submit_model(self, sched: SchedulerOutput) -> Callable[[], ModelRunnerOutput]:
        """Start a step and return what waits for its output. Steps are collected in the order they
        were submitted; executors that cannot overlap steps run it here."""
        output = self.execute_model(sched)
        return lambda: output

    def raise_if_failed(self) -> None:
        """WorkerDiedError once a rank has failed: the engine must not schedule on a broken replica."""

    def determine_num_blocks(self) -> int:
        """The KV cache blocks every rank can hold: the smallest of their answers."""
        return min(self.collective_rpc("determine_num_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", num_blocks)

    def bytes_per_block(self) -> int:
        """One block's bytes on rank 0 (every rank holds its own heads' share)."""
        return self.collective_rpc("bytes_per_block")[0]


def make_executor(config: EngineConfig) -> Executor:
    backend = config.parallel_config.distributed_executor_backend
    if backend == "uni":
        from tram.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config)
    if backend == "mp":
        from tram.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config)
    if backend == "ray":
        from tram.executor.ray_executor import RayExecutor

        return RayExecutor(config)
    raise ValueError(f"unknown executor backend {backend!r}")
