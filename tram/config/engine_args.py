"""Engine settings with vLLM's names, each declared once, and their resolution into the configs
each layer reads. `tram serve/generate` flags and `LLM(...)` keywords are these fields."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from tram.config.cli_args import CliSettings, setting
from tram.config.engine import (EXECUTOR_BACKENDS, KV_CACHE_DTYPES, CacheConfig, EngineConfig, ParallelConfig,
                                SchedulerConfig)
from tram.config.model import DTYPES, GGUF_ACTIVATIONS, LOAD_FORMATS, ModelConfig
from tram.model.gguf.file import is_gguf

ATTENTION_BACKENDS = ("torch", "triton")
_POSITIVE = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks_override",
             "kv_cache_memory_bytes", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
# vLLM's tokenizer modes Tram serves: both load the model's fast (Rust `tokenizers`) tokenizer.
TOKENIZER_MODES = ("auto", "hf")
GENERATION_CONFIG_FILE = "generation_config.json"


@dataclass
class EngineArgs(CliSettings):
    """Every engine setting: name, type, default and help, in one place."""

    model: str = setting(None, "local Hugging Face model folder or hub id", positional=True)
    tokenizer: str | None = setting(None, "tokenizer folder or hub id (default: the model's)")
    tokenizer_mode: str = setting("auto", "auto or hf: the model's fast tokenizer (vLLM's slow, mistral and "
                                  "custom are not supported)")
    revision: str | None = setting(None, "hub revision (branch, tag or commit) of the model")
    download_dir: str | None = setting(None, "folder to download hub models into (default: the Hugging Face cache)")
    trust_remote_code: bool = setting(False, "allow model code from the hub (transformers' trust_remote_code)")
    generation_config: str = setting("auto", "sampling defaults of the server: auto = the model's "
                                     "generation_config.json, vllm = none, or a folder holding one")
    dtype: str = setting("auto", "weights and activations dtype; auto follows the checkpoint "
                         "(bfloat16 for float16 on CPU and float32 on CUDA)", choices=("auto", *DTYPES))
    seed: int = setting(0, "seed of dummy weights and of unseeded sampling")
    max_model_len: int | None = setting(None, "longest context (prompt + output) in tokens "
                                        "(default: the model's max_position_embeddings)")
    max_num_seqs: int = setting(256, "most requests in one step's batch")
    max_num_batched_tokens: int | None = setting(None, "token budget of one step (default: max(4096, max_num_seqs))")
    enable_chunked_prefill: bool = setting(True, "split long prompts over steps; always on in Tram "
                                           "(--no-enable-chunked-prefill is rejected)")
    block_size: int = setting(16, "tokens per KV cache block")
    enable_prefix_caching: bool = setting(True, "reuse the KV of prompt prefixes seen before")
    kv_cache_dtype: str = setting("auto", "KV cache element type: auto = the model's dtype; fp8 (= fp8_e4m3) or "
                                  "fp8_e5m2 store keys and values in one byte each, so the same memory holds 2x "
                                  "(bfloat16) or 4x (float32) the blocks", choices=KV_CACHE_DTYPES)
    num_gpu_blocks_override: int | None = setting(None, "KV cache blocks to allocate, whatever the memory")
    gpu_memory_utilization: float = setting(0.9, "fraction of GPU memory the engine may use (GPU only)")
    kv_cache_memory_bytes: int | None = setting(None, "KV cache size in bytes (default on CPU: 4 GiB or less)")
    load_format: str = setting("auto", "auto/safetensors: the checkpoint; dummy: seeded random weights",
                               choices=LOAD_FORMATS)
    attention_backend: str | None = setting(None, "attention kernels (default: triton on CUDA, torch elsewhere)",
                                            choices=ATTENTION_BACKENDS)
    device: str = setting("auto", "cpu, cuda, cuda:N, or auto (CUDA when visible)")
    quantization: str | None = setting(None, "quantize a float checkpoint's linear layers at load: int8 (per "
                                       "output channel) or int4 (groups of 128 input channels). "
                                       "A GPTQ, AWQ or compressed-tensors checkpoint sets it (gptq, awq, "
                                       "compressed-tensors) from its quantization_config",
                                       aliases=("-q",))
    gguf_activations: str = setting("float32", "GGUF files: what the quantized linears multiply the weights "
                                    "with. float32: the activations as they are, each weight widened to its "
                                    "dequantized value (the transformers oracle's numerics); int8: activations "
                                    "quantized per 32 values and integer dot products (llama.cpp's and vLLM's "
                                    "GGUF numerics: 1.2-2x faster kernels at 1-16 rows on Q5_0 and the "
                                    "K-quants, slower past ~64 rows; outputs differ slightly)",
                                    choices=GGUF_ACTIVATIONS)
    skip_tokenizer_init: bool = setting(False, "no tokenizer: prompts must be token ids, outputs carry no text")
    max_logprobs: int = setting(20, "most logprobs a request may ask for")
    enforce_eager: bool = setting(False, "no CUDA graphs (GPU only)")
    structured_outputs_backend: str = setting(
        "xgrammar", "grammar engine for JSON schemas, regexes, choices and grammars (guidance = llguidance)",
        choices=("auto", "xgrammar", "guidance"))
    structured_outputs_disable_any_whitespace: bool = setting(
        False, "JSON constraints allow no optional whitespace (a small model may otherwise emit spaces and "
        "newlines until max_tokens); as vLLM's structured_outputs_config.disable_any_whitespace")
    structured_outputs_compile_timeout: float = setting(
        30.0, "seconds a request's grammar may take to compile before that request fails")
    tensor_parallel_size: int = setting(1, "ranks to split each layer over (Megatron-style tensor parallelism; "
                                        "on CPU each rank gets its share of the cores)", aliases=("-tp",))
    pipeline_parallel_size: int = setting(1, "pipeline stages to split the layers over (contiguous runs of "
                                          "layers, a rank or TP group each)", aliases=("-pp",))
    data_parallel_size: int = setting(1, "engine cores (replicas, each with its own scheduler, KV cache and "
                                      "ranks) behind one API server; tram serve only", aliases=("-dp",))
    distributed_executor_backend: str | None = setting(
        None, "how ranks run: mp = a process per rank (the default past one rank), uni = in the engine "
        "core's process (one rank only), ray = a Ray actor per rank on the Ray cluster (RAY_ADDRESS, else a "
        "local one; pip install 'tram[ray]')", choices=EXECUTOR_BACKENDS)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(model=model, **kwargs)

    def validate(self) -> None:
        """Reject bad values and what Tram does not support, before anything is loaded (ValueError)."""
        for name in _POSITIVE:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"Unknown attention backend {self.attention_backend!r}. "
                             f"Supported backends: {', '.join(ATTENTION_BACKENDS)}")
        if not self.structured_outputs_compile_timeout > 0:
            raise ValueError("structured_outputs_compile_timeout must be positive, "
                             f"got {self.structured_outputs_compile_timeout}")
        if self.structured_outputs_backend not in ("auto", "xgrammar", "guidance", "llguidance"):
            raise ValueError(f"structured_outputs_backend {self.structured_outputs_backend!r} is not supported: "
                             "choose xgrammar or guidance (llguidance)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported: choose one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")
        self._validate_unsupported()
        if self.gguf_activations not in GGUF_ACTIVATIONS:
            raise ValueError(f"gguf_activations {self.gguf_activations!r} is not supported: choose one of "
                             f"{', '.join(GGUF_ACTIVATIONS)}")
        if self.gguf_activations != "float32" and not is_gguf(self.model):
            raise ValueError(f"gguf_activations {self.gguf_activations!r} applies to GGUF files; {self.model!r} "
                             "is not one")
        if self.quantization is not None and is_gguf(self.model):
            if self.quantization != "gguf":  # vLLM's name for what the file already is
                raise ValueError(f"quantization {self.quantization!r} does not apply to a GGUF file, whose weights "
                                 "are already quantized (leave it unset, or pass gguf)")
        elif self.quantization is not None:
            from tram.model.quant.apply import check_quantization

            check_quantization(self.quantization, "cuda" if self.device.startswith("cuda") else "cpu")
        if self.generation_config not in ("auto", "vllm") and not os.path.isfile(
                os.path.join(self.generation_config, GENERATION_CONFIG_FILE)):
            raise ValueError(f"generation_config {self.generation_config!r} must be auto, vllm, or a folder "
                             f"holding a {GENERATION_CONFIG_FILE}")

    def _validate_unsupported(self) -> None:
        """vLLM settings Tram accepts only at the values it implements."""
        if self.tokenizer_mode == "slow":
            raise ValueError("tokenizer_mode 'slow' is not supported: Tram's incremental detokenizer needs a fast "
                             "tokenizer (tokenizer.json); use --tokenizer-mode auto")
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise ValueError(f"tokenizer_mode {self.tokenizer_mode!r} is not supported: Tram loads Hugging Face "
                             f"fast tokenizers only ({' or '.join(TOKENIZER_MODES)})")
        if not self.enable_chunked_prefill:
            raise ValueError("--no-enable-chunked-prefill is not supported: Tram always splits long prompts over "
                             "steps within --max-num-batched-tokens (raise it to prefill more per step)")
        backend = self.distributed_executor_backend
        if backend == "ray":
            from tram.executor.ray_executor import import_ray

            import_ray()  # a clear one-line error now, not at start-up, when Ray is missing
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend {backend!r} is not supported: choose "
                             f"{' or '.join(EXECUTOR_BACKENDS)}")
        ranks = self.tensor_parallel_size * self.pipeline_parallel_size
        if backend == "uni" and ranks > 1:
            raise ValueError(f"distributed_executor_backend 'uni' runs one rank; tensor_parallel_size "
                             f"{self.tensor_parallel_size} x pipeline_parallel_size {self.pipeline_parallel_size} "
                             "needs mp")

    def _parallel_config(self, hf_config: Any) -> ParallelConfig:
        """The split, checked against the model's shape (ValueError when it does not divide)."""
        from tram.config.parallel_check import check_tensor_parallel

        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        check_tensor_parallel(hf_config, tp)
        if pp > int(hf_config.num_hidden_layers):
            raise ValueError(f"pipeline_parallel_size {pp} exceeds the model's {hf_config.num_hidden_layers} layers")
        backend = self.distributed_executor_backend or ("mp" if tp * pp > 1 else "uni")
        return ParallelConfig(tp, pp, backend, data_parallel_size=self.data_parallel_size)

    def _generation_config_folder(self, model_path: str) -> str | None:
        """The folder whose generation_config.json gives the server's sampling defaults (None: none)."""
        if self.generation_config == "auto":
            return None if model_path.endswith(".gguf") else model_path  # a GGUF file carries none
        return None if self.generation_config == "vllm" else self.generation_config

    def create_engine_config(self) -> EngineConfig:
        """Resolve the settings against the model's config; ValueError on a bad combination."""
        from tram.model.hub import resolve_model_path

        self.validate()
        model_path = resolve_model_path(self.model, self.revision, self.download_dir)
        model_config = ModelConfig(
            model=model_path, dtype=self.dtype, device=self.device, load_format=self.load_format,
            revision=self.revision, trust_remote_code=self.trust_remote_code, seed=self.seed,
            attention_backend=self.attention_backend, enforce_eager=self.enforce_eager,
            quantization=None if is_gguf(model_path) else self.quantization,
            gguf_activations=self.gguf_activations,
        )
        if model_config.quantization is not None:  # a quantized checkpoint's scheme, checked at start
            from tram.model.quant.apply import check_quantization

            check_quantization(model_config.quantization, "cuda" if self.device.startswith("cuda") else "cpu",
                               model_config.hf_config, self.tensor_parallel_size)
        derived_len = int(getattr(model_config.hf_config, "max_position_embeddings", 2048))
        max_model_len = self.max_model_len or derived_len
        if max_model_len > derived_len:
            raise ValueError(
                f"max_model_len {max_model_len} is larger than the model's maximum context "
                f"(max_position_embeddings = {derived_len})"
            )
        model_config.max_model_len = max_model_len
        max_batched = self.max_num_batched_tokens or max(4096, self.max_num_seqs)
        return EngineConfig(
            model_config=model_config,
            cache_config=CacheConfig(self.block_size, 0, self.enable_prefix_caching, self.kv_cache_dtype),
            scheduler_config=SchedulerConfig(self.max_num_seqs, max_batched, max_model_len),
            tokenizer=self.tokenizer or model_path,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
            skip_tokenizer_init=self.skip_tokenizer_init,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_logprobs=self.max_logprobs,
            generation_config=self._generation_config_folder(model_path),
            structured_outputs_backend=(
                "xgrammar" if self.structured_outputs_backend == "auto" else self.structured_outputs_backend),
            structured_outputs_compile_timeout=self.structured_outputs_compile_timeout,
            structured_outputs_disable_any_whitespace=self.structured_outputs_disable_any_whitespace,
            parallel_config=self._parallel_config(model_config.hf_config),
        )
