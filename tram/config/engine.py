"""The resolved configuration each layer reads: the cache and scheduler limits of the core, and the
engine configuration that bundles them with the model's. Plain data, torch-free, picklable."""
from __future__ import annotations

from dataclasses import dataclass, field

from tram.config.model import ModelConfig

DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE=4)


@dataclass
class CacheConfig:
    """Shape of the paged KV cache as the block pool sees it."""

    block_size: int = 16
    num_blocks: int = 0  # set once the worker has sized the cache
    enable_prefix_caching: bool = True


@dataclass
class SchedulerConfig:
    """Per-step limits of the iteration-level scheduler."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    max_model_len: int = 2048


EXECUTOR_BACKENDS = ("uni", "mp")


@dataclass
class ParallelConfig:
    """How the model is split over ranks, and which executor runs the ranks."""

    tensor_parallel_size: int = 1
    # uni: the worker in the engine core's process (only with one rank); mp: a process per rank.
    distributed_executor_backend: str = "uni"

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size


@dataclass
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    tokenizer: str
    revision: str | None
    trust_remote_code: bool
    skip_tokenizer_init: bool
    num_gpu_blocks_override: int | None
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float
    max_logprobs: int
    # The folder whose generation_config.json gives the server's sampling defaults; None: no defaults.
    generation_config: str | None = None
    structured_outputs_backend: str = "xgrammar"
    structured_outputs_compile_timeout: float = 30.0
    structured_outputs_disable_any_whitespace: bool = False
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
