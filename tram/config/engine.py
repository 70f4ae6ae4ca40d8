"""The resolved configuration each layer reads: the cache and scheduler limits of the core, and the
engine configuration that bundles them with the model's. Plain data, torch-free, picklable.

Defaults are EngineArgs' (a dataclass field's default is its class attribute), so that a config
built without the engine (tests, tools) means what the same settings mean on the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tram.config.engine_args import FALLBACK_MAX_MODEL_LEN, KV_CACHE_DTYPES, EngineArgs, default_token_budget
from tram.config.model import ModelConfig
from tram.config.speculative import SpeculativeConfig

DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE=4)
__all__ = [
    "DEFAULT_CPU_KV_CACHE_BYTES",
    "KV_CACHE_DTYPES",
    "CacheConfig",
    "EngineConfig",
    "ParallelConfig",
    "SchedulerConfig",
]


@dataclass
class CacheConfig:
    """Shape of the paged KV cache as the block pool sees it."""

    block_size: int = EngineArgs.block_size
    num_blocks: int = 0  # set once the worker has sized the cache
    enable_prefix_caching: bool = EngineArgs.enable_prefix_caching
    cache_dtype: str = EngineArgs.kv_cache_dtype  # one of KV_CACHE_DTYPES
    # False: one KV cache group of every layer, whatever their windows (kv_cache_groups.py).
    hybrid_kv_cache: bool = not EngineArgs.disable_hybrid_kv_cache_manager
    # Per KV cache group: its sliding window (None: full attention); set with the layout at start.
    group_windows: tuple[int | None, ...] = (None,)


@dataclass
class SchedulerConfig:
    """Per-step limits of the iteration-level scheduler."""

    max_num_seqs: int = EngineArgs.max_num_seqs
    max_num_batched_tokens: int = default_token_budget(EngineArgs.max_num_seqs)
    max_model_len: int = FALLBACK_MAX_MODEL_LEN
    # Slots past a request's scheduled tokens that its blocks must cover: a draft model writes the
    # K/V of the tokens it proposes there (speculative decoding), before the next step verifies them.
    num_lookahead_tokens: int = 0


@dataclass
class ParallelConfig:
    """How the model is split over ranks, and which executor runs the ranks."""

    tensor_parallel_size: int = EngineArgs.tensor_parallel_size
    pipeline_parallel_size: int = EngineArgs.pipeline_parallel_size
    # A name the executor layer registered (config's EXECUTOR_BACKENDS); None: the executor layer's
    # default for the world size (the engine fills it in when it resolves EngineArgs).
    distributed_executor_backend: str | None = EngineArgs.distributed_executor_backend
    # MoE layers: whole experts per tensor-parallel rank (vLLM's --enable-expert-parallel).
    enable_expert_parallel: bool = EngineArgs.enable_expert_parallel
    # Engine cores behind one API server (tram serve); each replica's own config says 1 and its index.
    data_parallel_size: int = EngineArgs.data_parallel_size
    data_parallel_index: int = 0
    # CPU threads of the whole replica, split over its ranks; None: from the environment and cores.
    cpu_threads: int | None = None
    # The node (IP) of each rank, where the executor knows it (Ray): a TP group spread over nodes
    # cannot use the shared-memory all-reduce. None: every rank on this machine.
    rank_nodes: tuple[str, ...] | None = None
    # The Ray cluster for the ray backend; None: RAY_ADDRESS, else `ray start`'s cluster, else a new
    # local one. Data-parallel replicas get the one cluster their API server joined.
    ray_address: str | None = None

    def tp_group_on_one_node(self, rank: int) -> bool:
        if self.rank_nodes is None:
            return True
        first = rank - rank % self.tensor_parallel_size
        return len(set(self.rank_nodes[first : first + self.tensor_parallel_size])) == 1

    @property
    def world_size(self) -> int:
        """Ranks of one replica: global rank = stage * tensor_parallel_size + tensor-parallel rank."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def output_rank(self) -> int:
        """The rank whose sampled tokens the engine reads: the last stage's first tensor-parallel rank."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size


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
    structured_outputs_backend: str = EngineArgs.structured_outputs_backend
    structured_outputs_compile_timeout: float = EngineArgs.structured_outputs_compile_timeout
    structured_outputs_disable_any_whitespace: bool = EngineArgs.structured_outputs_disable_any_whitespace
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    speculative_config: SpeculativeConfig | None = None

    def for_workers(self) -> EngineConfig:
        """What the engine sends its worker processes: the model's config as a snapshot
        (ModelConfig.for_workers), so that a worker need not import transformers to read it; a
        draft model's config likewise."""
        spec = self.speculative_config
        if spec is not None and spec.draft_model_config is not None:
            spec = dataclasses.replace(spec, draft_model_config=spec.draft_model_config.for_workers())
        return dataclasses.replace(self, model_config=self.model_config.for_workers(), speculative_config=spec)
