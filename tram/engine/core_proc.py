"""The engine core in its own process: a busy loop of schedule -> execute -> sample -> update.

It reads requests and aborts from a ZMQ PULL socket between steps and pushes each step's outputs
(token ids, finish reasons, scheduler stats) to the API server. When idle it blocks on the socket, so
an idle server costs no CPU. It exits when told (SIGTERM), when its parent dies, or after reporting a
fatal error; a bad request only fails that request.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from typing import Any

import msgspec
import zmq

from tram.config import EngineConfig
from tram.core.request import RequestStatus
from tram.engine import messages
from tram.engine.core import EngineCore
from tram.engine.messages import EngineCoreOutputs
from tram.executor import cpu_share
from tram.executor.cpu_threads import engine_core_policy, usable_cores

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # how often an idle engine checks that its parent is still alive


class EngineCoreProc:
    def __init__(self, core: EngineCore, input_socket: zmq.Socket, output_socket: zmq.Socket, parent_pid: int) -> None:
        self.core = core
        self.input_socket = input_socket
        self.output_socket = output_socket
        self.parent_pid = parent_pid

    def run_busy_loop(self) -> None:
        while True:
            busy = self.core.has_unfinished_requests()
            if not self._drain_inputs(0 if busy else IDLE_POLL_MS) and not busy:
                if os.getppid() != self.parent_pid:
                    logger.info("engine core: the API server is gone; exiting")
                    return
                continue
            if self.core.has_unfinished_requests():
                self._send(messages.OUTPUTS, self.core.step_fn())

    def _drain_inputs(self, timeout_ms: int) -> bool:
        """Handle every message already waiting (waiting up to timeout_ms for the first)."""
        got = aborted = False
        while self.input_socket.poll(timeout_ms):
            got = True
            timeout_ms = 0
            kind, msg = messages.decode(self.input_socket.recv_multipart(), messages.INPUT_DECODERS)
            if kind == messages.ADD:
                self._add_request(msg)
            elif kind == messages.ABORT:
                status = RequestStatus.FINISHED_STOPPED if msg.stopped else RequestStatus.FINISHED_ABORTED
                self.core.abort_requests(msg.request_ids, status)
                aborted = True
            elif kind == messages.UTILITY:
                self._call_utility(msg)
        if aborted:
            # Aborts may leave the engine idle, and an idle engine sends nothing: report the freed
            # capacity now so gauges and the server's queue estimate do not stay stale.
            self._send(messages.OUTPUTS, EngineCoreOutputs([], self.core.get_stats()))
        return got

    def _add_request(self, req: Any) -> None:
        try:
            self.core.add_request(req)
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the loop
            param = getattr(e, "param", None)
            if param is not None:  # the client's mistake, found by the engine (SamplingParamError)
                logger.info("engine core: rejected request %s: %s", req.request_id, e)
                error = messages.RequestError(req.request_id, str(e), param, client_error=True)
            else:
                logger.exception("engine core: rejected request %s", req.request_id)
                error = messages.RequestError(req.request_id, f"{type(e).__name__}: {e}")
            self._send(messages.REQUEST_ERROR, error)

    def _call_utility(self, call: messages.UtilityCall) -> None:
        result = messages.UtilityResult(call.call_id)
        if call.method not in messages.UTILITY_METHODS:
            result.error = f"unknown engine core method {call.method!r}"
        else:
            try:
                value = getattr(self.core, call.method)(*call.args)
                # Structs travel as arrays: a dict keeps the caller free of their field order.
                result.result = msgspec.structs.asdict(value) if isinstance(value, msgspec.Struct) else value
            except Exception as e:  # noqa: BLE001 - report back to the caller
                result.error = f"{type(e).__name__}: {e}"
        self._send(messages.UTILITY_RESULT, result)

    def _send(self, kind: bytes, msg: Any) -> None:
        self.output_socket.send_multipart(messages.encode(kind, msg), copy=False)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _set_cpu_threads(config: EngineConfig, cpu_env: dict[str, str], parent_pid: int) -> None:
    """On CPU, set the model's thread count and log the threads and wait policy once (the rules and
    the measurements behind them: tram/executor/cpu_threads.py). `cpu_env` is what the API server added
    to this process's environment; without it, the rest is the environment the user started with.
    The default count follows what other processes than this one and the API server (`parent_pid`)
    use of the cores, where the model runs in this process (cpu_share.py)."""
    if config.model_config.device_type != "cpu":
        return
    import torch

    user_env = {k: v for k, v in os.environ.items() if k not in cpu_env}
    policy = engine_core_policy(user_env, usable_cores(), config.parallel_config.cpu_threads)
    if policy.shared_threads is not None and config.parallel_config.world_size == 1:
        cpu_share.install(policy.threads, policy.shared_threads, (os.getpid(), parent_pid), torch.set_num_threads)
    else:
        torch.set_num_threads(policy.threads)
    logger.info("engine core: %s", policy.describe())


def run_engine_core(
    config: EngineConfig, input_addr: str, output_addr: str, parent_pid: int, cpu_env: dict[str, str] | None = None
) -> None:
    """Process entry point (spawned by the API server)."""
    config.model_config.resolve()
    _set_cpu_threads(config, cpu_env or {}, parent_pid)
    # Ctrl-C reaches the whole process group; the API server decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ctx = zmq.Context()
    input_socket = ctx.socket(zmq.PULL)
    input_socket.connect(input_addr)
    output_socket = ctx.socket(zmq.PUSH)
    output_socket.setsockopt(zmq.LINGER, 1000)
    output_socket.connect(output_addr)
    proc: EngineCoreProc | None = None
    try:
        core = EngineCore(config)
        proc = EngineCoreProc(core, input_socket, output_socket, parent_pid)
        cc = config.cache_config
        mc = config.model_config
        proc._send(
            messages.READY,
            messages.ReadyInfo(
                cc.num_blocks, cc.block_size, config.scheduler_config.max_model_len, mc.dtype, mc.device
            ),
        )
        proc.run_busy_loop()
    except SystemExit:
        pass
    except BaseException as e:  # noqa: BLE001 - report any crash to the server before dying
        logger.error("engine core died:\n%s", traceback.format_exc())
        output_socket.send_multipart(messages.encode(messages.FATAL, messages.FatalError(f"{type(e).__name__}: {e}")))
        if proc is not None:
            try:
                proc.core.shutdown()  # stop worker processes that are still alive
            except Exception:  # noqa: BLE001 - still exit
                logger.exception("engine core: shutdown after the crash failed")
        output_socket.close()  # lingers up to a second to deliver FATAL
        # Every socket must be closed, or ctx.term() waits forever (a crash mid-serve hung here).
        input_socket.close(linger=0)
        ctx.term()
        sys.exit(1)
    if proc is not None:
        proc.core.shutdown()  # cancel grammar compiles not started yet
    output_socket.close(linger=0)
    input_socket.close(linger=0)
    ctx.term()
