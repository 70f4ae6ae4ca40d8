"""Each GGUF architecture Tram serves: its transformers class and config, and the settings of the
family that its metadata carries (or that llama.cpp fixes for it, where the converter writes none).

Torch-free (file.py builds the config in the API server process). What convert_hf_to_gguf.py writes
per family, and what llama.cpp reads back (src/models/<arch>.cpp), decides every default here: a
file means what llama.cpp computes from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class Meta:
    """A file's metadata under its architecture's prefix (`gemma3.attention.sliding_window`), and
    its tensors by name."""

    fields: dict[str, Any]
    arch: str
    tensors: dict[str, Any]
    path: str

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(f"{self.arch}.{key}", default)

    def number(self, key: str, default: float) -> float:
        """A float32 setting as the decimal the Hugging Face config held (`decimal`); absent or zero
        (llama.cpp's "unset"): the default."""
        value = self.get(key)
        return decimal(value) if value else default


def decimal(value: float) -> float:
    """The shortest decimal that rounds to this float32 value: 1e-05 for the 9.999999747378752e-06 a
    file stores for a config's 1e-05. Computing in float32 rounds it back to the same value; the
    config then reads as the original did."""
    return float(str(np.float32(value)))


# (metadata, the config's common keywords) -> the family's keywords (which replace common ones)
Extras = Callable[[Meta, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Architecture:
    hf_architecture: str  # config.architectures[0]: what Tram's registry serves it with
    config_class: str  # the transformers config class
    extras: Extras | None = None


def layer_types(meta: Meta, num_layers: int, window: int | None, default_pattern: int) -> list[str]:
    """Each layer's attention kind. llama.cpp reads `attention.sliding_window_pattern` as one bool per
    layer or as a period n (layers i with i % n < n - 1 slide); Gemma's converters write neither, and
    llama.cpp then fixes the period per family (Gemma 2: 2, Gemma 3: 6: five local layers, one global)."""
    if not window:
        return [FULL] * num_layers
    pattern = meta.get("attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(
                f"{meta.path}: {meta.arch}.attention.sliding_window_pattern has {len(pattern)} entries "
                f"for {num_layers} layers"
            )
        return [SLIDING if slides else FULL for slides in pattern]
    n = int(pattern)
    return [SLIDING if n == 0 or i % n < n - 1 else FULL for i in range(num_layers)]


def _gemma_query_scalar(kw: dict[str, Any], layers_of_27b: int) -> int:
    """llama.cpp scales Gemma's queries by head_dim ** -0.5, except in the 27B models (recognised by
    their layer count), whose query_pre_attn_scalar is hidden_size / num_heads; the file says nothing."""
    if kw["num_hidden_layers"] == layers_of_27b:
        return kw["hidden_size"] // kw["num_attention_heads"]  # llama.cpp's integer division
    return kw["head_dim"]


def _gemma3(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    window = int(meta.get("attention.sliding_window", 0)) or None
    # Local layers: their own base (10000 where the file has none, as llama.cpp) and no scaling; the
    # global layers take the file's base and scaling (the common rope_parameters).
    local = {"rope_type": "default", "rope_theta": meta.number("rope.freq_base_swa", 10000.0)}
    softcap = meta.number("final_logit_softcapping", 0.0)
    return dict(
        sliding_window=window,
        layer_types=layer_types(meta, kw["num_hidden_layers"], window, 6),
        rope_parameters={FULL: kw["rope_parameters"], SLIDING: local},
        query_pre_attn_scalar=_gemma_query_scalar(kw, 62),
        final_logit_softcapping=None if not softcap else float(softcap),
        attn_logit_softcapping=None,
    )


def _gemma2(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp's Gemma 2 defaults where a key is missing: window 4096, soft-caps 50 and 30.
    window = int(meta.get("attention.sliding_window", 4096))
    return dict(
        sliding_window=window,
        layer_types=layer_types(meta, kw["num_hidden_layers"], window, 2),
        query_pre_attn_scalar=_gemma_query_scalar(kw, 46),
        attn_logit_softcapping=meta.number("attn_logit_softcapping", 50.0),
        final_logit_softcapping=meta.number("final_logit_softcapping", 30.0),
    )


def _phi3(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    """Partial rotary as the rotary width over head_dim; LongRoPE (Phi-3 128k, Phi-4-mini) as the
    factor tensors the converter writes instead of the config's long_factor/short_factor lists."""
    head_dim = kw["head_dim"]
    partial = int(meta.get("rope.dimension_count", head_dim)) / head_dim
    original = int(meta.get("rope.scaling.original_context_length", kw["max_position_embeddings"]))
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": kw["rope_parameters"]["rope_theta"],
        "partial_rotary_factor": partial,
    }
    factors = {k: meta.tensors.get(f"rope_factors_{k}.weight") for k in ("long", "short")}
    if factors["long"] is not None:
        if factors["short"] is None:
            raise ValueError(f"{meta.path} has rope_factors_long.weight but no rope_factors_short.weight")
        # transformers derives the attention factor from the two lengths, as the converter did.
        rope.update(
            rope_type="longrope",
            long_factor=[decimal(v) for v in factors["long"].data.reshape(-1)],
            short_factor=[decimal(v) for v in factors["short"].data.reshape(-1)],
            original_max_position_embeddings=original,
        )
    # A Phi-4 file says 0: no window; Phi-3.5-mini and Phi-4-mini say 262144, past their context
    # (131072), which is no window either.
    window = int(meta.get("attention.sliding_window", 0))
    window = window if 0 < window < kw["max_position_embeddings"] else None
    return dict(
        rope_parameters=rope,
        partial_rotary_factor=partial,
        original_max_position_embeddings=original,
        sliding_window=window,
    )


def _smollm3(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp leaves RoPE out of every 4th layer (n_no_rope_layer_step = 4); the file has no key.
    n = kw["num_hidden_layers"]
    return dict(no_rope_layer_interval=4, no_rope_layers=[int((i + 1) % 4 != 0) for i in range(n)])


def _granite(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    """Granite's multipliers, which the converter writes as llama.cpp's `*_scale` keys; a missing (or
    zero) key is llama.cpp's default: no scaling, and attention's usual head_dim ** -0.5."""
    return dict(
        attention_multiplier=meta.number("attention.scale", kw["head_dim"] ** -0.5),
        embedding_multiplier=meta.number("embedding_scale", 1.0),
        residual_multiplier=meta.number("residual_scale", 1.0),
        logits_scaling=meta.number("logit_scale", 1.0),
    )


def _olmo2(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    # The converter writes OLMo 3 as olmo2 with sliding-window layers; only OLMo 2 is served.
    if meta.get("attention.sliding_window"):
        raise ValueError(
            f"{meta.path} is an OLMo 3 file (olmo2 with sliding-window layers), which Tram does not serve yet"
        )
    return {}


def _experts(meta: Meta) -> dict[str, int]:
    """The metadata every mixture of experts has: how many experts, and how many each token uses."""
    return dict(num_experts=int(meta.get("expert_count", 0)), num_experts_per_tok=int(meta.get("expert_used_count", 0)))


def _qwen3moe(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp runs every layer of a qwen3moe file through its experts (Qwen3-MoE's mlp_only_layers
    and decoder_sparse_step have no key), and always renormalises the top k weights: it passes
    norm_w = true for this architecture and reads no `expert_weights_norm`, which the converter does
    not write for it. An expert's width absent: llama.cpp's feed_forward_length / expert_used_count."""
    experts = _experts(meta)
    if not experts["num_experts"] or not experts["num_experts_per_tok"]:
        raise ValueError(f"{meta.path}: a qwen3moe file needs {meta.arch}.expert_count and expert_used_count")
    width = meta.get("expert_feed_forward_length") or kw["intermediate_size"] // experts["num_experts_per_tok"]
    return dict(
        **experts,
        moe_intermediate_size=int(width),
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def _mixtral(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    """Mixtral, which the converter writes as llama with experts: feed_forward_length is each expert's
    width, every layer has experts, the top k weights are renormalised (llama.cpp's llama graph), and,
    as for Mistral, no sliding window is written or applied."""
    experts = _experts(meta)
    return dict(
        num_local_experts=experts["num_experts"],
        num_experts_per_tok=experts["num_experts_per_tok"],
        sliding_window=None,
    )


def _gpt_oss(meta: Meta, kw: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss: llama.cpp slides on the even layers (pattern 2), reads each expert's width from
    expert_feed_forward_length, gates with a softmax over the top k (no renormalisation key) and
    clamps the SwiGLU at its published 7.0 with alpha 1.702, neither of which the file carries."""
    experts = _experts(meta)
    window = int(meta.get("attention.sliding_window", 0)) or None
    return dict(
        num_local_experts=experts["num_experts"],
        num_experts_per_tok=experts["num_experts_per_tok"],
        intermediate_size=int(meta.get("expert_feed_forward_length") or kw["intermediate_size"]),
        sliding_window=window,
        layer_types=layer_types(meta, kw["num_hidden_layers"], window, 2),
        swiglu_limit=7.0,
        attention_bias=True,
    )


# general.architecture -> how Tram serves it (Mistral files are written as llama too)
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("LlamaForCausalLM", "LlamaConfig"),
    "qwen2": Architecture("Qwen2ForCausalLM", "Qwen2Config"),
    "qwen3": Architecture("Qwen3ForCausalLM", "Qwen3Config"),
    "gemma2": Architecture("Gemma2ForCausalLM", "Gemma2Config", _gemma2),
    "gemma3": Architecture("Gemma3ForCausalLM", "Gemma3TextConfig", _gemma3),
    "phi3": Architecture("Phi3ForCausalLM", "Phi3Config", _phi3),
    "smollm3": Architecture("SmolLM3ForCausalLM", "SmolLM3Config", _smollm3),
    "granite": Architecture("GraniteForCausalLM", "GraniteConfig", _granite),
    "olmo2": Architecture("Olmo2ForCausalLM", "Olmo2Config", _olmo2),
    "qwen3moe": Architecture("Qwen3MoeForCausalLM", "Qwen3MoeConfig", _qwen3moe),
    "gpt-oss": Architecture("GptOssForCausalLM", "GptOssConfig", _gpt_oss),
}
MIXTRAL = Architecture("MixtralForCausalLM", "MixtralConfig", _mixtral)


def served_architecture(fields: dict[str, Any], arch: str) -> Architecture:
    """How Tram serves a file of `arch` (one of ARCHITECTURES): a llama file with experts is Mixtral."""
    if arch == "llama" and int(fields.get("llama.expert_count", 0) or 0) > 0:
        return MIXTRAL
    return ARCHITECTURES[arch]
