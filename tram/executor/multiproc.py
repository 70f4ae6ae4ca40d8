"""The multiprocessing executor: one worker process per rank on this node.

Per step the engine encodes the scheduler output once and pushes the same bytes to every rank over
ZMQ (ipc sockets), then waits for rank 0's output; the ranks meet each other only in the model's
collectives (torch.distributed). While it waits it watches the processes: a rank that exits or
reports an error fails the step with WorkerDiedError, and every rank is stopped. The workers are
plain subprocesses (`python -m tram.executor.worker_proc`), so a daemonic engine-core process can
start them, and they end themselves when the engine's process is gone.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

import zmq

from tram.config import EngineConfig
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.executor import messages as m
from tram.executor.base import Executor, WorkerDiedError
from tram.executor.cpu_threads import rank_threads, usable_cores
from tram.executor.worker_proc import WorkerArgs

logger = logging.getLogger(__name__)

POLL_MS = 100  # how often a waiting engine checks that its workers are alive
READY_TIMEOUT_S = 1800.0  # loading a large checkpoint (and building kernels on a first run) takes a while
STOP_TIMEOUT_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        self.world_size = config.parallel_config.world_size
        self._output_rank = config.parallel_config.output_rank
        self._dir = tempfile.mkdtemp(prefix="tram-mp-")
        self._ctx = zmq.Context()
        self._replies = self._ctx.socket(zmq.PULL)
        self._replies.bind(f"ipc://{self._dir}/replies")
        self._inboxes: list[zmq.Socket] = []
        self._procs: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._inboxes, self._ctx, self._dir)
        self._dead: str | None = None
        threads, env = rank_threads(
            dict(os.environ), usable_cores(), self.world_size, config.parallel_config.cpu_threads
        )
        init_method = f"tcp://127.0.0.1:{free_port()}"
        config = config.for_workers()
        try:
            for rank in range(self.world_size):
                self._start_worker(config, rank, init_method, threads, env)
            self._wait(m.READY, range(self.world_size), READY_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "Started %d worker processes (pids %s), %d CPU thread(s) each on CPU",
            self.world_size,
            ", ".join(str(p.pid) for p in self._procs),
            threads,
        )

    def _start_worker(
        self, config: EngineConfig, rank: int, init_method: str, threads: int, env: dict[str, str]
    ) -> None:
        inbox = self._ctx.socket(zmq.PUSH)
        inbox.bind(f"ipc://{self._dir}/rank{rank}")
        self._inboxes.append(inbox)
        args = WorkerArgs(
            config,
            rank,
            self.world_size,
            init_method,
            f"ipc://{self._dir}/rank{rank}",
            f"ipc://{self._dir}/replies",
            os.getpid(),
            threads,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "tram.executor.worker_proc"], stdin=subprocess.PIPE, env={**os.environ, **env}
        )
        self._procs.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(args))
        proc.stdin.close()

    # ---- calls -----------------------------------------------------------------------------
    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        self._broadcast(m.encode_rpc(method, args))
        results = self._wait(m.RESULT, range(self.world_size), None)
        return [pickle.loads(results[r]) for r in range(self.world_size)]

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.submit_model(sched)()

    def submit_model(self, sched: SchedulerOutput) -> Callable[[], ModelRunnerOutput]:
        """Every rank queues the step at once; the output rank answers steps in order, so each
        collector takes the next answer (collectors must be called in submission order)."""
        self._broadcast(m.encode_sched(sched))
        rank = self._output_rank
        return lambda: m.decode_output(self._wait(m.OUTPUT, (rank,), None)[rank])

    def _broadcast(self, frames: list[bytes]) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)
        for inbox in self._inboxes:
            inbox.send_multipart(frames, copy=False)

    def _wait(self, kind: bytes, ranks: Any, timeout_s: float | None) -> dict[int, bytes]:
        """Each of `ranks`' reply of `kind`; WorkerDiedError when a rank fails, exits or times out."""
        wanted = set(ranks)
        got: dict[int, bytes] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while wanted - got.keys():
            if self._replies.poll(POLL_MS):
                frame_kind, rank, payload = self._replies.recv_multipart()
                if frame_kind == m.ERROR:
                    self._fail(self._root_cause(f"worker rank {int(rank)} failed: {pickle.loads(payload)}"))
                got[int(rank)] = payload
                continue
            for rank, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    self._fail(f"worker rank {rank} (pid {proc.pid}) exited with code {proc.returncode}")
            if deadline is not None and time.monotonic() > deadline:
                self._fail(f"workers {sorted(wanted - got.keys())} did not answer within {timeout_s:.0f} s")
        return got

    def _root_cause(self, reason: str) -> str:
        """A rank whose peer died fails in its collective; name the rank that exited first, if one did."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for rank, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    return f"worker rank {rank} (pid {proc.pid}) exited with code {proc.returncode}; then {reason}"
            time.sleep(0.05)
        return reason

    def _fail(self, reason: str) -> None:
        logger.error("%s; stopping every worker", reason)
        self._dead = reason
        for proc in self._procs:  # the others may be stuck in a collective with the dead rank
            if proc.poll() is None:
                proc.terminate()
        self.shutdown()
        raise WorkerDiedError(reason)

    def raise_if_failed(self) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)

    def shutdown(self) -> None:
        self._finalizer()


def _stop(procs: list[subprocess.Popen], inboxes: list[zmq.Socket], ctx: zmq.Context, folder: str) -> None:
    """Tell the workers to leave (also when the executor is only collected, or the program ends without
    a shutdown), wait a little for them, then terminate, then kill; close the sockets."""
    for inbox in inboxes:  # a rank that is gone, or stuck beside a dead one, is terminated below
        try:
            inbox.send_multipart([m.SHUTDOWN], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    ctx.destroy(linger=0)
    shutil.rmtree(folder, ignore_errors=True)
