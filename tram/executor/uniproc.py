"""The one-rank executor: the worker lives in the engine core's process and a step is a call."""

from __future__ import annotations

from typing import Any

from tram.config import EngineConfig
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.executor import cpu_share
from tram.executor.base import Executor
from tram.worker.model_runner import ModelRunner
from tram.worker.worker import Worker


class UniProcExecutor(Executor):
    world_size = 1

    def __init__(self, config: EngineConfig) -> None:
        self.worker = Worker(config)

    @property
    def model_runner(self) -> ModelRunner:
        return self.worker.model_runner

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        return [getattr(self.worker, method)(*args)]

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        cpu_share.before_step()  # the default thread count follows the machine (no-op where fixed)
        try:
            return self.worker.execute_model(sched)
        finally:
            cpu_share.after_step()

    def shutdown(self) -> None:
        pass
