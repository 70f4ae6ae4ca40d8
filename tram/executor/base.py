"""What the engine core asks of its executor, whatever runs the ranks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from tram.config import EngineConfig
from tram.config.registry import EXECUTOR_BACKENDS
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.executor.backends import default_executor_backend


class WorkerDiedError(RuntimeError):
    """A rank's process exited or failed: every request in flight fails, and the engine stops."""


class Executor(ABC):
    """Runs the ranks of one model replica.

    `collective_rpc` calls a Worker method on every rank and returns each rank's answer, in rank
    order; `execute_model` runs one step on every rank and returns the output of the last pipeline
    stage's first rank (its tensor-parallel peers sample the same tokens). Both raise WorkerDiedError
    when a rank is gone; the executor is then unusable.
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

    def raise_if_failed(self) -> None:  # noqa: B027 - executors that cannot lose a rank keep this
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
    """The executor backend the config names (registered in backends.py), built for the config."""
    pc = config.parallel_config
    return EXECUTOR_BACKENDS.load(pc.distributed_executor_backend or default_executor_backend(pc.world_size))(config)
