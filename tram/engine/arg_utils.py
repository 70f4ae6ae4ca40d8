"""Engine arguments with vLLM's names, and their resolution into the configs each layer needs."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tram.config import LOAD_FORMATS, ModelConfig, resolve_device, resolve_dtype
from tram.core.config import CacheConfig, SchedulerConfig
from tram.model.attention import default_attention_backend

DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE=4)


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


@dataclass
class EngineArgs:
    model: str
    tokenizer: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    load_format: str = "auto"
    attention_backend: str | None = None
    device: str = "auto"
    skip_tokenizer_init: bool = False
    max_logprobs: int = 20
    enforce_eager: bool = False

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(model=model, **kwargs)

    def _validate(self) -> None:
        def positive(name: str, value: int | None) -> None:
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")

        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                     "num_gpu_blocks_override", "kv_cache_memory_bytes"):
            positive(name, getattr(self, name))
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")

    def create_engine_config(self) -> EngineConfig:
        from tram.model.loader import get_hf_config, resolve_model_path

        self._validate()
        model_path = resolve_model_path(self.model, self.revision)
        hf_config = get_hf_config(model_path, self.revision, self.trust_remote_code)
        device = resolve_device(self.device)
        derived_len = int(getattr(hf_config, "max_position_embeddings", 2048))
        max_model_len = self.max_model_len or derived_len
        if max_model_len > derived_len:
            raise ValueError(
                f"max_model_len {max_model_len} is larger than the model's maximum context "
                f"(max_position_embeddings = {derived_len})"
            )
        backend = self.attention_backend or default_attention_backend(device.type)
        model_config = ModelConfig(
            model=model_path, hf_config=hf_config, dtype=resolve_dtype(self.dtype, hf_config, device),
            device=device, max_model_len=max_model_len, load_format=self.load_format,
            revision=self.revision, seed=self.seed, attention_backend=backend, enforce_eager=self.enforce_eager,
        )
        max_batched = self.max_num_batched_tokens or max(4096, self.max_num_seqs)
        return EngineConfig(
            model_config=model_config,
            cache_config=CacheConfig(self.block_size, 0, self.enable_prefix_caching),
            scheduler_config=SchedulerConfig(self.max_num_seqs, max_batched, max_model_len),
            tokenizer=self.tokenizer or model_path,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
            skip_tokenizer_init=self.skip_tokenizer_init,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_logprobs=self.max_logprobs,
        )
