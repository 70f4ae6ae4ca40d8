"""One rank of the model: its shard of the weights and of the KV cache, and the model runner that
executes each step on them. The executor (tram/executor/) owns the workers and says where they run:
in the engine core's process (one rank) or one process per rank.
"""

from __future__ import annotations

import logging

from tram.config import EngineConfig
from tram.config.model import device_type
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.distributed import get_pp, get_tp, init_parallel, set_expert_parallel
from tram.worker.kv_cache import cpu_kv_cache_blocks, kv_cache_layout
from tram.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def determine_num_blocks(config: EngineConfig, runner: ModelRunner) -> int:
    """Blocks from an explicit count, else from a memory budget."""
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    mc, sc = config.model_config, config.scheduler_config
    bytes_per_block = runner.bytes_per_block()
    if device_type(mc.device) != "cuda":
        return cpu_kv_cache_blocks(config, runner.kv_cache_layout, bytes_per_block)
    if config.kv_cache_memory_bytes is not None:
        return max(1, config.kv_cache_memory_bytes // bytes_per_block)
    budget = runner.profile_memory().kv_cache_budget(config.gpu_memory_utilization)
    if budget < bytes_per_block:
        raise ValueError(
            f"No GPU memory is left for the KV cache ({budget / 2**30:.2f} GiB after weights and the "
            f"peak of a {sc.max_num_batched_tokens}-token step). Raise gpu_memory_utilization (now "
            f"{config.gpu_memory_utilization}), or lower max_num_batched_tokens or max_num_seqs."
        )
    return budget // bytes_per_block


class Worker:
    """Rank `rank` of `world_size`: joins the tensor-parallel group (init_method: torch.distributed's
    rendezvous address), then loads its shard of the model. Every rank runs every step on the same
    scheduler output, so their persistent batches stay equal; each samples from the same gathered
    logits with the same random state, so they pick the same tokens."""

    def __init__(
        self, config: EngineConfig, rank: int = 0, world_size: int = 1, init_method: str | None = None
    ) -> None:
        self.config = config
        self.rank = rank
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        mc.resolve()
        if world_size > 1 and mc.device_type == "cuda":
            # One GPU per rank, in rank order (this process owns its copy of the config).
            import torch

            mc.device = f"cuda:{rank}"
            torch.cuda.set_device(rank)
        if world_size > 1:
            assert init_method is not None
            pc = config.parallel_config
            init_parallel(
                rank,
                pc.tensor_parallel_size,
                pc.pipeline_parallel_size,
                init_method,
                mc.device_type,
                shm_ok=pc.tp_group_on_one_node(rank),
            )
        set_expert_parallel(config.parallel_config.enable_expert_parallel)
        self.model_runner = ModelRunner(
            mc,
            cc.block_size,
            sc.max_num_seqs,
            sc.max_num_batched_tokens,
            cc.cache_dtype,
            kv_cache_layout(config),
            config.speculative_config,
        )

    def determine_num_blocks(self) -> int:
        """The blocks this rank's memory holds; the engine takes the smallest over ranks."""
        return determine_num_blocks(self.config, self.model_runner)

    def bytes_per_block(self) -> int:
        return self.model_runner.bytes_per_block()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(sched)

    def describe(self) -> str:
        tp, pp = get_tp(), get_pp()
        return f"TP rank {tp.rank} of {tp.size} ({tp.backend}), pipeline stage {pp.rank} of {pp.size}"
