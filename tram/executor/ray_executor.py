"""The Ray executor: one Ray actor per rank, placed by a placement group on the user's Ray cluster
(`ray start --head` / `ray start --address=...`), so ranks may sit on different machines.

Ray places the ranks; torch.distributed still carries the model's collectives (rendezvous at rank
0's node). A step is one Ray call per rank with the same encoded scheduler output; the last stage's
first rank returns the output. A rank whose actor or node dies fails the step with WorkerDiedError
and the executor stops every other rank. Ranks on one node that hold a whole TP group use the
shared-memory all-reduce; across nodes, gloo (or NCCL).

Ray is an optional dependency (`pip install 'tram-llm[ray]'`), imported only here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tram.config import EngineConfig
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.executor import messages as m
from tram.executor.backends import import_ray
from tram.executor.base import Executor, WorkerDiedError
from tram.executor.cpu_threads import ray_rank_threads

logger = logging.getLogger(__name__)


def join_ray(address: str | None) -> tuple[str, bool]:
    """Connect this process to a Ray cluster: `address`, else RAY_ADDRESS, else the one `ray start`
    made on this machine, else a new local one. Returns the cluster's GCS address, which other
    processes pass to join the same cluster, and whether this call connected."""
    ray = import_ray()
    joined = not ray.is_initialized()
    if joined:
        with _keep_signal_handlers():
            ray.init(address=address or os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    return ray.get_runtime_context().gcs_address, joined


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """Ray's driver installs a failure handler for SIGTERM and SIGINT that aborts the process; the
    API server and the engine core must keep their own, which shut down cleanly (and stop Ray)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


class RankActor:
    """One rank inside a Ray worker process (made a Ray actor class by RayExecutor)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.worker: Any = None
        self.rank = 0

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        from tram.executor.multiproc import free_port

        return free_port()

    def start(self, config: EngineConfig, rank: int, world_size: int, init_method: str) -> None:
        import torch

        from tram.worker.worker import Worker

        if config.model_config.device_type == "cpu":
            torch.set_num_threads(self.threads)
        torch.manual_seed(config.model_config.seed)  # every rank draws the same random numbers
        self.rank = rank
        self.worker = Worker(config, rank, world_size, init_method)

    def execute(self, payload: bytes, reply: bool) -> bytes | None:
        output = self.worker.execute_model(m.decode_sched(payload))
        return m.encode_output(self.rank, output)[2] if reply else None

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        return getattr(self.worker, method)(*args)


class RayExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self._remove_pg = remove_placement_group
        pc = config.parallel_config
        self.world_size = pc.world_size
        self._output_rank = pc.output_rank
        join_ray(pc.ray_address)
        cuda = config.model_config.device_type == "cuda"
        threads = ray_rank_threads(dict(os.environ), pc.cpu_threads, self.world_size)
        bundle = {"GPU": 1, "CPU": 1} if cuda else {"CPU": threads}
        self._pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        ray.get(self._pg.ready(), timeout=600)
        actor_cls = ray.remote(RankActor)
        self._actors = [
            actor_cls.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, i),
            ).remote(threads)
            for i in range(self.world_size)
        ]
        self._dead: str | None = None
        try:
            self._start(config)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, config: EngineConfig) -> None:
        ray = self._ray
        ips = ray.get([a.node_ip.remote() for a in self._actors])
        self.node_ips = ips
        port = ray.get(self._actors[0].free_port.remote())
        init_method = f"tcp://{ips[0]}:{port}"
        # A TP group spread over machines cannot share memory: the workers check rank_nodes.
        parallel = dataclasses.replace(config.parallel_config, rank_nodes=tuple(ips))
        config = dataclasses.replace(config.for_workers(), parallel_config=parallel)
        self._get([a.start.remote(config, rank, self.world_size, init_method) for rank, a in enumerate(self._actors)])
        logger.info("Started %d Ray actors on nodes %s", self.world_size, ", ".join(ips))

    def _get(self, refs: list[Any]) -> list[Any]:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayError as e:
            self._dead = f"a Ray worker rank failed: {type(e).__name__}: {e}"
            logger.error("%s; stopping every rank", self._dead)
            self.shutdown()
            raise WorkerDiedError(self._dead) from None

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        return self._get([a.call.remote(method, args) for a in self._actors])

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.submit_model(sched)()

    def submit_model(self, sched: SchedulerOutput) -> Callable[[], ModelRunnerOutput]:
        """Each actor runs its calls in order, so steps submitted back to back overlap across stages."""
        if self._dead is not None:
            raise WorkerDiedError(self._dead)
        payload = m.encode_sched(sched)[1]
        refs = [a.execute.remote(payload, rank == self._output_rank) for rank, a in enumerate(self._actors)]
        return lambda: m.decode_output(self._get(refs)[self._output_rank])

    def raise_if_failed(self) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)

    def shutdown(self) -> None:
        for actor in getattr(self, "_actors", []):
            try:
                self._ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []
        if getattr(self, "_pg", None) is not None:
            try:
                self._remove_pg(self._pg)
            except Exception:  # noqa: BLE001
                pass
            self._pg = None
