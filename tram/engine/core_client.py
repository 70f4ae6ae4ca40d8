"""The API server's handle on the engine core process: start it, send it messages, receive its outputs.

Sending uses a plain (blocking) PUSH socket with no high-water mark, so a send never waits; receiving
runs as an asyncio task on the server's event loop. A thread waits on the process sentinel so that a
dead engine is noticed at once, whatever it was doing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from tram.config import EngineConfig
from tram.engine import messages
from tram.engine.messages import EngineCoreOutputs, EngineCoreRequest
from tram.executor.cpu_threads import choose_cpu_threads, environment, usable_cores

logger = logging.getLogger(__name__)


def _engine_core_main(*args: object) -> None:
    """The engine core process's target. The API server pickles this function, not the engine core
    module, so that it never imports the model runner or torch itself."""
    from tram.engine.core_proc import run_engine_core

    run_engine_core(*args)  # type: ignore[arg-type]


class EngineDeadError(RuntimeError):
    """The engine core process has exited; nothing more can be served."""


class EngineCoreClient:
    def __init__(
        self,
        config: EngineConfig,
        on_outputs: Callable[[EngineCoreOutputs], None],
        on_request_error: Callable[[messages.RequestError], None],
        on_dead: Callable[[str], None],
    ) -> None:
        self.config = config
        self.on_outputs = on_outputs
        self.on_request_error = on_request_error
        self.on_dead = on_dead
        self.dead_reason: str | None = None
        self.ready_info: messages.ReadyInfo | None = None
        self._fatal: str | None = None
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._ipc_dir = tempfile.mkdtemp(prefix="tram-ipc-")
        input_addr, output_addr = f"ipc://{self._ipc_dir}/input", f"ipc://{self._ipc_dir}/output"
        self._sync_ctx = zmq.Context()
        self._input = self._sync_ctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)
        self._input.bind(input_addr)
        self._async_ctx = zmq.asyncio.Context()
        self._output = self._async_ctx.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._output.bind(output_addr)
        # The OpenMP wait policy goes into the child's environment at spawn: libgomp reads it when
        # torch loads, and the child loads torch before any of our code runs there (executor/cpu_threads.py).
        self.cpu_env = choose_cpu_threads(os.environ, usable_cores()).env
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(
            target=_engine_core_main,
            args=(config, input_addr, output_addr, os.getpid(), self.cpu_env),
            name="TramEngineCore",
            daemon=True,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._output_task: asyncio.Task | None = None
        self._ready = asyncio.Event()

    async def start(self) -> messages.ReadyInfo:
        """Start the engine process and wait until it has loaded the model and sized its cache."""
        self._loop = asyncio.get_running_loop()
        with environment(self.cpu_env):  # the spawned child inherits os.environ as it is at start()
            self.process.start()
        threading.Thread(target=self._watch_process, name="tram-engine-watch", daemon=True).start()
        self._output_task = asyncio.create_task(self._output_loop())
        await self._ready.wait()
        if self.ready_info is None:
            raise EngineDeadError(f"the engine core failed to start: {self.dead_reason}")
        return self.ready_info

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None

    def _watch_process(self) -> None:
        # Wait on the sentinel rather than join(): only the event loop's thread reaps the process.
        multiprocessing.connection.wait([self.process.sentinel])
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._mark_dead)

    def _mark_dead(self) -> None:
        if self.dead_reason is not None:
            return
        # Let a FATAL message still in the socket be read first: it says why.
        asyncio.get_running_loop().call_later(0.05, self._finish_dead)

    def _finish_dead(self) -> None:
        if self.dead_reason is not None:
            return
        code = self.process.exitcode
        self.dead_reason = self._fatal or f"the engine core process exited (exit code {code})"
        logger.error("engine core is dead: %s", self.dead_reason)
        self._ready.set()
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(self.dead_reason))
        self._calls.clear()
        self.on_dead(self.dead_reason)

    async def _output_loop(self) -> None:
        while True:
            frames = await self._output.recv_multipart()
            try:
                kind, msg = messages.decode(frames, messages.OUTPUT_DECODERS)
                self._dispatch(kind, msg)
            except Exception:  # noqa: BLE001 - a handler bug must not stop the output stream
                logger.exception("error while handling engine core output")

    def _dispatch(self, kind: bytes, msg: Any) -> None:
        if kind == messages.OUTPUTS:
            self.on_outputs(msg)
        elif kind == messages.REQUEST_ERROR:
            self.on_request_error(msg)
        elif kind == messages.UTILITY_RESULT:
            fut = self._calls.pop(msg.call_id, None)
            if fut is not None and not fut.done():
                if msg.error is not None:
                    fut.set_exception(RuntimeError(msg.error))
                else:
                    fut.set_result(msg.result)
        elif kind == messages.READY:
            self.ready_info = msg
            self._ready.set()
        elif kind == messages.FATAL:
            self._fatal = msg.message

    def _send(self, kind: bytes, msg: Any) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        self._input.send_multipart(messages.encode(kind, msg))

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(messages.ADD, request)

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None:
        if request_ids and self.dead_reason is None:
            self._send(messages.ABORT, messages.AbortRequests(request_ids, stopped))

    async def call_utility(self, method: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        self._send(messages.UTILITY, messages.UtilityCall(call_id, method, list(args)))
        return await fut

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the engine process (SIGTERM, then SIGKILL) and release the sockets."""
        if self.dead_reason is None:
            self.dead_reason = "the engine is shutting down"
        if self._output_task is not None:
            self._output_task.cancel()
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout)
        self._input.close(linger=0)
        self._output.close(linger=0)
        self._sync_ctx.term()
        self._async_ctx.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
