"""Engine settings with vLLM's names, each declared once: `tram serve/generate` flags and `LLM(...)`
keywords are these fields, and the resolved configs (engine.py, model.py) take their defaults from
them. The engine resolves them into an EngineConfig (tram/engine/engine_config.py); the values a
layer owns (attention backends, quantization methods, ...) are validated against its registry.

This module is the root of the package: it imports nothing else of configuration but the flag
machinery and the registry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from tram.config.cli_args import CliSettings, check_choices, setting
from tram.config.registry import (
    ATTENTION_BACKENDS,
    EXECUTOR_BACKENDS,
    GGUF_ACTIVATIONS,
    QUANTIZATION_METHODS,
    SPECULATIVE_METHODS,
    STRUCTURED_OUTPUTS_BACKENDS,
)
from tram.config.speculative import parse_speculative_config

# dtype spellings users may pass -> the canonical torch name.
DTYPES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
}
LOAD_FORMATS = ("auto", "safetensors", "dummy")
# vLLM's --kv-cache-dtype values: auto = the model's dtype; fp8 = fp8_e4m3 (torch.float8_e4m3fn, with a
# per-layer scale) or fp8_e5m2 (torch.float8_e5m2): one byte per element.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM's tokenizer modes Tram serves: both load the model's fast (Rust `tokenizers`) tokenizer.
TOKENIZER_MODES = ("auto", "hf")
GENERATION_CONFIG_FILE = "generation_config.json"
# The context of a model whose config gives no max_position_embeddings.
FALLBACK_MAX_MODEL_LEN = 2048
_MIN_TOKEN_BUDGET = 4096
_POSITIVE = (
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_gpu_blocks_override",
    "kv_cache_memory_bytes",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
)


def default_token_budget(max_num_seqs: int) -> int:
    """max_num_batched_tokens when unset: a decode step of max_num_seqs tokens must fit."""
    return max(_MIN_TOKEN_BUDGET, max_num_seqs)


@dataclass
class EngineArgs(CliSettings):
    """Every engine setting: name, type, default and help, in one place."""

    model: str = setting(None, "local Hugging Face model folder or hub id", positional=True)
    tokenizer: str | None = setting(None, "tokenizer folder or hub id (default: the model's)")
    tokenizer_mode: str = setting(
        "auto", "auto or hf: the model's fast tokenizer (vLLM's slow, mistral and custom are not supported)"
    )
    revision: str | None = setting(None, "hub revision (branch, tag or commit) of the model")
    download_dir: str | None = setting(None, "folder to download hub models into (default: the Hugging Face cache)")
    trust_remote_code: bool = setting(False, "allow model code from the hub (transformers' trust_remote_code)")
    generation_config: str = setting(
        "auto",
        "sampling defaults of the server: auto = the model's "
        "generation_config.json, vllm = none, or a folder holding one",
    )
    dtype: str = setting(
        "auto",
        "weights and activations dtype; auto follows the checkpoint (bfloat16 for float16 on CPU and float32 on CUDA)",
        choices=("auto", *DTYPES),
    )
    seed: int = setting(0, "seed of dummy weights and of unseeded sampling")
    max_model_len: int | None = setting(
        None, "longest context (prompt + output) in tokens (default: the model's max_position_embeddings)"
    )
    max_num_seqs: int = setting(256, "most requests in one step's batch")
    max_num_batched_tokens: int | None = setting(
        None, f"token budget of one step (default: max({_MIN_TOKEN_BUDGET}, max_num_seqs))"
    )
    enable_chunked_prefill: bool = setting(
        True, "split long prompts over steps; always on in Tram (--no-enable-chunked-prefill is rejected)"
    )
    block_size: int = setting(16, "tokens per KV cache block")
    enable_prefix_caching: bool = setting(True, "reuse the KV of prompt prefixes seen before")
    disable_hybrid_kv_cache_manager: bool = setting(
        False,
        "keep the whole context for every layer, even layers with a sliding window (as vLLM's flag); by "
        "default a model mixing full and sliding-window layers keeps only the window for the latter",
    )
    kv_cache_dtype: str = setting(
        "auto",
        "KV cache element type: auto = the model's dtype; fp8 (= fp8_e4m3) or "
        "fp8_e5m2 store keys and values in one byte each, so the same memory holds 2x "
        "(bfloat16) or 4x (float32) the blocks",
        choices=KV_CACHE_DTYPES,
    )
    num_gpu_blocks_override: int | None = setting(None, "KV cache blocks to allocate, whatever the memory")
    gpu_memory_utilization: float = setting(0.9, "fraction of GPU memory the engine may use (GPU only)")
    kv_cache_memory_bytes: int | None = setting(None, "KV cache size in bytes (default on CPU: 4 GiB or less)")
    load_format: str = setting(
        "auto", "auto/safetensors: the checkpoint; dummy: seeded random weights", choices=LOAD_FORMATS
    )
    attention_backend: str | None = setting(
        None, "attention kernels (default: the device's)", choices=ATTENTION_BACKENDS
    )
    device: str = setting("auto", "cpu, cuda, cuda:N, or auto (CUDA when visible)")
    quantization: str | None = setting(
        None,
        "weight-only quantization of the linear layers: made at load from "
        "a float checkpoint, or read from a quantized checkpoint, whose "
        "quantization_config sets it",
        choices=QUANTIZATION_METHODS,
        aliases=("-q",),
    )
    gguf_activations: str = setting(
        "float32", "GGUF files: what the quantized linears multiply the weights with", choices=GGUF_ACTIVATIONS
    )
    skip_tokenizer_init: bool = setting(False, "no tokenizer: prompts must be token ids, outputs carry no text")
    max_logprobs: int = setting(20, "most logprobs a request may ask for")
    enforce_eager: bool = setting(False, "no CUDA graphs (GPU only)")
    structured_outputs_backend: str = setting(
        "xgrammar",
        "grammar engine for JSON schemas, regexes, choices and grammars",
        choices=STRUCTURED_OUTPUTS_BACKENDS,
    )
    structured_outputs_disable_any_whitespace: bool = setting(
        False,
        "JSON constraints in vLLM's layout without optional whitespace (as its "
        "structured_outputs_config.disable_any_whitespace): guidance then drops the space after ',' and ':' "
        "that the compact default keeps; xgrammar's is the default's",
    )
    structured_outputs_compile_timeout: float = setting(
        30.0, "seconds a request's grammar may take to compile before that request fails"
    )
    tensor_parallel_size: int = setting(
        1,
        "ranks to split each layer over (Megatron-style tensor parallelism; "
        "on CPU each rank gets its share of the cores)",
        aliases=("-tp",),
    )
    pipeline_parallel_size: int = setting(
        1,
        "pipeline stages to split the layers over (contiguous runs of layers, a rank or TP group each)",
        aliases=("-pp",),
    )
    enable_expert_parallel: bool = setting(
        False,
        "mixture-of-experts layers place whole experts on each tensor-parallel rank (the experts split "
        "over the ranks) instead of a slice of every expert",
    )
    data_parallel_size: int = setting(
        1,
        "engine cores (replicas, each with its own scheduler, KV cache and "
        "ranks) behind one API server; tram serve only",
        aliases=("-dp",),
    )
    distributed_executor_backend: str | None = setting(
        None, "how ranks run (default: mp past one rank, else uni)", choices=EXECUTOR_BACKENDS
    )
    speculative_config: dict[str, Any] | None = setting(
        None,
        "speculative decoding, as a JSON object (vLLM's), e.g. "
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}; '
        "method",
        choices=SPECULATIVE_METHODS,
    )

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(model=model, **kwargs)

    def validate(self) -> None:
        """Reject bad values and what Tram does not support, before anything is loaded (ValueError).
        A layer's choices are checked against its registry, with the checks it registered."""
        for name in _POSITIVE:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.structured_outputs_compile_timeout > 0:
            raise ValueError(
                f"structured_outputs_compile_timeout must be positive, got {self.structured_outputs_compile_timeout}"
            )
        self._validate_unsupported()
        check_choices(self)
        parse_speculative_config(self.speculative_config)
        if self.generation_config not in ("auto", "vllm") and not os.path.isfile(
            os.path.join(self.generation_config, GENERATION_CONFIG_FILE)
        ):
            raise ValueError(
                f"generation_config {self.generation_config!r} must be auto, vllm, or a folder "
                f"holding a {GENERATION_CONFIG_FILE}"
            )

    def _validate_unsupported(self) -> None:
        """vLLM settings Tram accepts only at the values it implements."""
        if self.tokenizer_mode == "slow":
            raise ValueError(
                "tokenizer_mode 'slow' is not supported: Tram's incremental detokenizer needs a fast "
                "tokenizer (tokenizer.json); use --tokenizer-mode auto"
            )
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise ValueError(
                f"tokenizer_mode {self.tokenizer_mode!r} is not supported: Tram loads Hugging Face "
                f"fast tokenizers only ({' or '.join(TOKENIZER_MODES)})"
            )
        if not self.enable_chunked_prefill:
            raise ValueError(
                "--no-enable-chunked-prefill is not supported: Tram always splits long prompts over "
                "steps within --max-num-batched-tokens (raise it to prefill more per step)"
            )
