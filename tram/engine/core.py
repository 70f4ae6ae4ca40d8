"""The engine core: schedule -> execute -> update, over token ids only.

It runs in-process under the offline `LLM` and, for the server, in its own process behind ZMQ;
that is why its inputs and outputs are msgspec structs.
"""
from __future__ import annotations

import logging

from tram.core.request import Request, RequestStatus
from tram.core.scheduler import Scheduler
from tram.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from tram.config.model import device_type
from tram.engine.messages import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from tram.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def determine_num_blocks(config: EngineConfig, runner: ModelRunner) -> int:
    """Blocks from an explicit count, else from a memory budget."""
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    mc, sc, cc = config.model_config, config.scheduler_config, config.cache_config
    bytes_per_block = runner.bytes_per_block()
    if config.kv_cache_memory_bytes is not None:
        return max(1, config.kv_cache_memory_bytes // bytes_per_block)
    if device_type(mc.device) == "cuda":
        budget = runner.profile_memory().kv_cache_budget(config.gpu_memory_utilization)
        if budget < bytes_per_block:
            raise ValueError(
                f"No GPU memory is left for the KV cache ({budget / 2**30:.2f} GiB after weights and the "
                f"peak of a {sc.max_num_batched_tokens}-token step). Raise gpu_memory_utilization (now "
                f"{config.gpu_memory_utilization}), or lower max_num_batched_tokens or max_num_seqs."
            )
        return budget // bytes_per_block
    # On CPU, never reserve more than every sequence at full length could use at once.
    most_useful = sc.max_num_seqs * -(-sc.max_model_len // cc.block_size)
    return max(1, min(DEFAULT_CPU_KV_CACHE_BYTES // bytes_per_block, most_useful))


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        config.model_config.resolve()
        cc, sc = config.cache_config, config.scheduler_config
        self.model_runner = ModelRunner(config.model_config, cc.block_size, sc.max_num_seqs, sc.max_num_batched_tokens)
        cc.num_blocks = determine_num_blocks(config, self.model_runner)
        capacity = cc.num_blocks * cc.block_size
        if capacity < sc.max_model_len:
            raise ValueError(
                f"The KV cache holds {capacity} tokens ({cc.num_blocks} blocks of {cc.block_size}), fewer "
                f"than max_model_len={sc.max_model_len}. Lower max_model_len or give the cache more "
                "room (num_gpu_blocks_override, kv_cache_memory_bytes or gpu_memory_utilization)."
            )
        self.model_runner.initialize_kv_cache(cc.num_blocks)
        logger.info(
            "KV cache: %d blocks, %d tokens (%.1f MiB); maximum concurrency at %d tokens per request: %.2fx",
            cc.num_blocks, capacity, cc.num_blocks * self.model_runner.bytes_per_block() / 2**20,
            sc.max_model_len, capacity / sc.max_model_len,
        )
        self.scheduler = Scheduler(sc, cc)

    def add_request(self, req: EngineCoreRequest) -> None:
        source = None
        if req.prefix_source_id is not None:
            source = self.scheduler.requests.get(req.prefix_source_id)
        request = Request(
            req.request_id, req.prompt_token_ids, req.sampling_params, req.eos_token_ids,
            self.config.scheduler_config.max_model_len, req.arrival_time, source,
        )
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.scheduler.finish_requests(request_ids, status)

    def step(self) -> EngineCoreOutputs:
        sched = self.scheduler.schedule()
        result = self.model_runner.execute_model(sched)
        return self.scheduler.update_from_output(sched, result)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def check_kv_integrity(self) -> dict[str, int]:
        return self.scheduler.kv_cache_manager.check_integrity()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.kv_cache_manager.reset_prefix_cache()
