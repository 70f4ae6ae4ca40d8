"""Data parallelism: N engine cores (each its own scheduler, KV cache and workers, each possibly
tensor-parallel) behind one API server, and the router that picks one for each request.

Routing: the least-loaded replica (requests in flight, counted here), unless another replica whose
load is within `slack` of it already holds more of the prompt's leading blocks in its prefix cache;
then that one, so a shared system prompt or a conversation's earlier turns are not recomputed on a
replica that never saw them. Which replica holds which prefix is tracked here, from the prompts
routed to it (chained hashes of full blocks, the same cut the KV cache manager makes), in a
bounded LRU per replica; a replica may have evicted a block since, which costs a recompute, never
a wrong answer. Siblings of an n > 1 request go where their prefix source went.

Every replica is one EngineCoreClient (its own process, sockets and death watch); the replicas'
outputs reach the front end tagged with their index, so /metrics can label them. With the Ray
backend the API server joins (or starts) the Ray cluster once and hands its address to every
replica, so that all of them place their ranks on one cluster rather than each starting its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tram.config import EngineConfig
from tram.engine import messages
from tram.engine.core_client import EngineCoreClient, EngineDeadError
from tram.engine.messages import EngineCoreOutputs, EngineCoreRequest, SpecDecodingCounts
from tram.executor.cpu_threads import replica_threads, usable_cores

logger = logging.getLogger(__name__)

PREFIX_BLOCKS_KEPT = 65536  # block hashes remembered per replica
MAX_PREFIX_BLOCKS = 64  # leading blocks of a prompt looked up


def prefix_block_hashes(token_ids: list[int], block_size: int, limit: int = MAX_PREFIX_BLOCKS) -> list[int]:
    """Chained hashes of the prompt's leading full blocks: block i's hash covers blocks 0..i."""
    hashes, parent = [], 0
    for start in range(0, min(len(token_ids) // block_size, limit) * block_size, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class PrefixRouter:
    """Chooses a replica per request from loads and remembered prefixes (see the module docstring)."""

    def __init__(self, num_replicas: int, block_size: int, slack: int) -> None:
        self.block_size = block_size
        self.slack = slack
        self.loads = [0] * num_replicas
        self.prefixes: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.owner: dict[str, int] = {}

    def _cached_blocks(self, replica: int, hashes: list[int]) -> int:
        known = self.prefixes[replica]
        count = 0
        for h in hashes:
            if h not in known:
                break
            count += 1
        return count

    def route(self, request: EngineCoreRequest) -> int:
        source = request.prefix_source_id
        if source is not None and source in self.owner:
            replica = self.owner[source]
        else:
            hashes = prefix_block_hashes(request.prompt_token_ids, self.block_size)
            least = min(self.loads)
            close = [i for i, load in enumerate(self.loads) if load <= least + self.slack]
            replica = max(close, key=lambda i: (self._cached_blocks(i, hashes), -self.loads[i], -i))
            known = self.prefixes[replica]
            for h in hashes:
                known[h] = None
                known.move_to_end(h)
            while len(known) > PREFIX_BLOCKS_KEPT:
                known.popitem(last=False)
        self.owner[request.request_id] = replica
        self.loads[replica] += 1
        return replica

    def finish(self, request_id: str) -> None:
        replica = self.owner.pop(request_id, None)
        if replica is not None:
            self.loads[replica] -= 1


class DPEngineCoreClient:
    """The EngineCoreClient interface over N replicas (add, abort, utilities, start, shutdown)."""

    def __init__(
        self,
        config: EngineConfig,
        on_outputs: Callable[[EngineCoreOutputs, int], None],
        on_request_error: Callable[[messages.RequestError], None],
        on_dead: Callable[[str], None],
    ) -> None:
        size = config.parallel_config.data_parallel_size
        self.on_outputs = on_outputs
        self.on_request_error = on_request_error
        self.on_dead = on_dead
        self.dead_reason: str | None = None
        slack = max(1, config.scheduler_config.max_num_seqs // 16)
        self.router = PrefixRouter(size, config.cache_config.block_size, slack)
        self._ray_joined = False
        if config.parallel_config.distributed_executor_backend == "ray":
            config = self._join_ray(config)
        self.replicas = [
            EngineCoreClient(replica_config(config, i), self._outputs_of(i), self._request_error, self._replica_dead(i))
            for i in range(size)
        ]

    def _join_ray(self, config: EngineConfig) -> EngineConfig:
        from tram.executor.ray_executor import join_ray

        address, self._ray_joined = join_ray(config.parallel_config.ray_address)
        logger.info("Data-parallel replicas place their ranks on the Ray cluster at %s", address)
        parallel = dataclasses.replace(config.parallel_config, ray_address=address)
        return dataclasses.replace(config, parallel_config=parallel)

    def _outputs_of(self, index: int) -> Callable[[EngineCoreOutputs], None]:
        def handle(outputs: EngineCoreOutputs) -> None:
            for out in outputs.outputs:
                if out.finished:
                    self.router.finish(out.request_id)
            for error in outputs.request_errors:
                self.router.finish(error.request_id)
            self.on_outputs(outputs, index)

        return handle

    def _request_error(self, error: messages.RequestError) -> None:
        self.router.finish(error.request_id)
        self.on_request_error(error)

    def _replica_dead(self, index: int) -> Callable[[str], None]:
        def dead(reason: str) -> None:
            if self.dead_reason is not None:
                return
            self.dead_reason = f"data-parallel replica {index}: {reason}"
            self.on_dead(self.dead_reason)

        return dead

    async def start(self) -> messages.ReadyInfo:
        infos = await asyncio.gather(*(replica.start() for replica in self.replicas))
        return infos[0]

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and all(r.is_alive for r in self.replicas)

    def add_request(self, request: EngineCoreRequest) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        replica = self.router.route(request)
        try:
            self.replicas[replica].add_request(request)
        except BaseException:
            self.router.finish(request.request_id)
            raise

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None:
        by_replica: dict[int, list[str]] = {}
        for rid in request_ids:
            replica = self.router.owner.get(rid)
            if replica is not None:
                by_replica.setdefault(replica, []).append(rid)
                self.router.finish(rid)
        for replica, ids in by_replica.items():
            self.replicas[replica].abort_requests(ids, stopped)

    async def call_utility(self, method: str, *args: Any) -> Any:
        results = await asyncio.gather(*(r.call_utility(method, *args) for r in self.replicas))
        return combine_results(results)

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.dead_reason is None:
            self.dead_reason = "the engine is shutting down"
        for replica in self.replicas:
            replica.shutdown(timeout)
        if self._ray_joined:  # after the replicas, whose ranks live on the cluster
            import ray

            ray.shutdown()
            self._ray_joined = False


def replica_config(config: EngineConfig, index: int) -> EngineConfig:
    """Replica `index`'s copy of the configuration (its own cache sizing, process and threads)."""
    threads = replica_threads(dict(os.environ), usable_cores(), config.parallel_config.data_parallel_size)
    parallel = dataclasses.replace(
        config.parallel_config, data_parallel_size=1, data_parallel_index=index, cpu_threads=threads
    )
    return dataclasses.replace(config, parallel_config=parallel, cache_config=dataclasses.replace(config.cache_config))


def _add_spec_counts(counts: list[SpecDecodingCounts]) -> SpecDecodingCounts | None:
    if not counts:
        return None
    width = max(len(c.accepted_per_pos) for c in counts)
    per_pos = [sum(c.accepted_per_pos[i] for c in counts if i < len(c.accepted_per_pos)) for i in range(width)]
    return SpecDecodingCounts(
        sum(c.num_drafts for c in counts),
        sum(c.num_draft_tokens for c in counts),
        sum(c.num_accepted_tokens for c in counts),
        per_pos,
    )


def combine_results(results: list[Any]) -> Any:
    """One answer from every replica's: dicts of numbers add up (KV block counts, scheduler stats;
    the KV cache usage is averaged), booleans must all hold."""
    first = results[0]
    if isinstance(first, bool):
        return all(results)
    if isinstance(first, dict):
        combined: dict[str, Any] = {}
        for key, value in first.items():
            values = [r[key] for r in results]
            if key == "kv_cache_usage":
                combined[key] = sum(values) / len(values)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                combined[key] = sum(values)
            elif isinstance(value, list):
                combined[key] = [v for vs in values for v in vs]
            elif isinstance(value, SpecDecodingCounts) or key == "spec_decoding":
                combined[key] = _add_spec_counts([v for v in values if v is not None])
            else:
                combined[key] = value
        return combined
    return results
