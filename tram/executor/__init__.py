"""Executors: where the model's ranks run, and how a step reaches them (the layer between the engine
core and the workers). `uni` keeps the one worker in the engine core's process; `mp` runs a process
per rank and broadcasts each step's scheduler output to all of them."""

from tram.executor.base import Executor, WorkerDiedError, make_executor

__all__ = ["Executor", "WorkerDiedError", "make_executor"]
