"""EngineArgs resolved into the EngineConfig every layer reads, in the process that builds the engine
(the LLM's, or the API server's) before any other process starts: so that every refusal, a layer's
included, is a ValueError there, and the engine core and workers receive settled values.

Importing this module registers the choices of the layers the engine drives (model, executor,
structured outputs) with configuration, so that EngineArgs validates against them. Torch-free: the
API server process resolves the config without torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tram.spec_decode  # noqa: F401 - registers the proposers
import tram.structured_output.backend  # noqa: F401 - registers the grammar engines
from tram.config import CacheConfig, EngineArgs, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from tram.config.engine_args import FALLBACK_MAX_MODEL_LEN, default_token_budget
from tram.config.model import device_type, load_hf_config
from tram.config.parallel_check import check_expert_parallel, check_tensor_parallel
from tram.config.registry import STRUCTURED_OUTPUTS_BACKENDS
from tram.config.speculative import SpeculativeConfig, parse_speculative_config
from tram.executor.backends import default_executor_backend
from tram.model.choices import check_model_files, check_sliding_window, checkpoint_quantization
from tram.model.gguf.file import is_gguf
from tram.model.hub import config_reader, resolve_model_path
from tram.model.quant.check import check_quantization
from tram.spec_decode import MODEL_METHODS


def create_engine_config(args: EngineArgs) -> EngineConfig:
    """Validate `args`, find the model's files and config, and resolve the settings against them;
    ValueError on a bad value or combination."""
    args.validate()
    model_path = resolve_model_path(args.model, args.revision, args.download_dir)
    check_model_files(model_path, args.tensor_parallel_size)
    model_config = _model_config(args, model_path)
    max_model_len = model_config.max_model_len
    speculative_config = _speculative_config(args, model_config)
    lookahead = speculative_config.num_speculative_tokens if _drafts_with_a_model(speculative_config) else 0
    return EngineConfig(
        model_config=model_config,
        cache_config=CacheConfig(
            args.block_size,
            0,
            args.enable_prefix_caching,
            args.kv_cache_dtype,
            hybrid_kv_cache=not args.disable_hybrid_kv_cache_manager,
        ),
        scheduler_config=SchedulerConfig(
            args.max_num_seqs,
            args.max_num_batched_tokens or default_token_budget(args.max_num_seqs),
            max_model_len,
            lookahead,
        ),
        tokenizer=args.tokenizer or model_path,
        revision=args.revision,
        trust_remote_code=args.trust_remote_code,
        skip_tokenizer_init=args.skip_tokenizer_init,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_logprobs=args.max_logprobs,
        generation_config=_generation_config_folder(args, model_path),
        structured_outputs_backend=STRUCTURED_OUTPUTS_BACKENDS.canonical(args.structured_outputs_backend),
        structured_outputs_compile_timeout=args.structured_outputs_compile_timeout,
        structured_outputs_disable_any_whitespace=args.structured_outputs_disable_any_whitespace,
        parallel_config=_parallel_config(args, model_config.hf_config),
        speculative_config=speculative_config,
    )


def _model_config(args: EngineArgs, model_path: str) -> ModelConfig:
    """The model's config read (a GGUF file's too), its quantization checked against the checkpoint
    and the device, and its context length against the model's."""
    reader = config_reader(model_path)
    hf_config = load_hf_config(model_path, args.revision, args.trust_remote_code, reader)
    check_sliding_window(hf_config, model_path)
    quantization = checkpoint_quantization(hf_config, None if is_gguf(model_path) else args.quantization)
    if quantization is not None:  # a quantized checkpoint's scheme, checked at start
        check_quantization(
            quantization, "cuda" if device_type(args.device) == "cuda" else "cpu", hf_config, args.tensor_parallel_size
        )
    derived_len = int(getattr(hf_config, "max_position_embeddings", FALLBACK_MAX_MODEL_LEN))
    max_model_len = args.max_model_len or derived_len
    if max_model_len > derived_len:
        raise ValueError(
            f"max_model_len {max_model_len} is larger than the model's maximum context "
            f"(max_position_embeddings = {derived_len})"
        )
    return ModelConfig(
        model=model_path,
        hf_config=hf_config,
        config_reader=reader,
        dtype=args.dtype,
        device=args.device,
        max_model_len=max_model_len,
        load_format=args.load_format,
        revision=args.revision,
        trust_remote_code=args.trust_remote_code,
        seed=args.seed,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        quantization=quantization,
        gguf_activations=args.gguf_activations,
    )


def _parallel_config(args: EngineArgs, hf_config: Any) -> ParallelConfig:
    """The split, checked against the model's shape (ValueError when it does not divide)."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    check_tensor_parallel(hf_config, tp)
    check_expert_parallel(hf_config, tp, args.enable_expert_parallel)
    if pp > int(hf_config.num_hidden_layers):
        raise ValueError(f"pipeline_parallel_size {pp} exceeds the model's {hf_config.num_hidden_layers} layers")
    backend = args.distributed_executor_backend or default_executor_backend(tp * pp)
    return ParallelConfig(
        tp,
        pp,
        backend,
        enable_expert_parallel=args.enable_expert_parallel,
        data_parallel_size=args.data_parallel_size,
    )


def _speculative_config(args: EngineArgs, target: ModelConfig) -> SpeculativeConfig | None:
    """The proposer's settings, a draft model's config read and checked against the target's;
    pipeline stages take no drafts (only the last stage samples, and a step's rejected tokens would
    have to reach every stage)."""
    spec = parse_speculative_config(args.speculative_config)
    if spec is None:
        return None
    if args.pipeline_parallel_size > 1:
        raise ValueError("speculative decoding does not run with pipeline_parallel_size > 1")
    if spec.method not in MODEL_METHODS:
        if spec.model is not None:
            raise ValueError(f"speculative_config method {spec.method!r} takes no model")
        return spec
    if spec.model is None:
        raise ValueError(f"speculative_config method {spec.method!r} needs a model: the draft checkpoint")
    return dataclasses.replace(spec, draft_model_config=_draft_model_config(args, spec.method, spec.model, target))


def _drafts_with_a_model(spec: SpeculativeConfig | None) -> bool:
    return spec is not None and spec.draft_model_config is not None


def _draft_model_config(args: EngineArgs, method: str, model: str, target: ModelConfig) -> ModelConfig:
    """The draft's config: the target's dtype, device and context length (a draft model must reach
    it; an EAGLE head, which only extends the target's features, is stretched to it). Its K/V sits in
    the target's blocks (one block table for both), so neither may have a sliding window; and its
    tokens are the target's, so the vocabularies must match, and a head's width too (it reads the
    target's embedding)."""
    path = resolve_model_path(model, None, args.download_dir)
    check_model_files(path, args.tensor_parallel_size)
    head = method != "draft_model"
    draft_args = dataclasses.replace(
        args,
        model=path,
        max_model_len=None if head else target.max_model_len,
        quantization=None,
        revision=None,
        tokenizer=None,
    )
    try:
        draft = _model_config(draft_args, path)
    except ValueError as e:
        raise ValueError(f"the draft model {model}: {e}") from e
    draft.max_model_len = target.max_model_len
    if head and int(draft.hf_config.hidden_size) != int(target.hf_config.hidden_size):
        raise ValueError(
            f"the {method} head's hidden_size ({draft.hf_config.hidden_size}) is not the target's "
            f"({target.hf_config.hidden_size}): it was trained for another model"
        )
    got, want = int(draft.hf_config.vocab_size), int(target.hf_config.vocab_size)
    if got != want:
        raise ValueError(
            f"the draft model's vocabulary ({got} tokens) is not the target's ({want}): "
            "a draft must share its tokenizer"
        )
    for name, config in (("target", target), ("draft", draft)):
        window = getattr(config.hf_config, "sliding_window", None)
        if window and getattr(config.hf_config, "use_sliding_window", True) and window < target.max_model_len:
            raise ValueError(f"a draft model needs full attention in both models; the {name} has a sliding window")
    check_tensor_parallel(draft.hf_config, args.tensor_parallel_size)
    return draft


def _generation_config_folder(args: EngineArgs, model_path: str) -> str | None:
    """The folder whose generation_config.json gives the server's sampling defaults (None: none)."""
    if args.generation_config == "auto":
        return None if is_gguf(model_path) else model_path  # a GGUF file carries none
    return None if args.generation_config == "vllm" else args.generation_config
