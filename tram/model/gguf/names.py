"""GGUF tensor names as the Hugging Face parameter names Tram's models use, per architecture, and
the changes convert_hf_to_gguf.py makes to some tensors' values (which the loader undoes).

Torch-free. The converter maps Hugging Face names through gguf-py's tensor table restricted to the
architecture, so one GGUF name can stand for different Hugging Face names: `ffn_norm` is Llama's
post_attention_layernorm but Gemma's pre_feedforward_layernorm; `ffn_up` is Phi-3's fused gate_up_proj.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import numpy as np

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
}
# Gemma 2/3 norm around attention and the MLP ("sandwich"): Hugging Face's post_attention_layernorm
# follows attention there, so it is written as post_attention_norm and ffn_norm is the pre-MLP norm.
_SANDWICH = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# OLMo 2 has only the post-norms (and q/k norms over all heads at once, named as Llama's per-head ones).
_OLMO2 = {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# Phi-3 keeps its fused projections: attn_qkv is [q; k; v] and ffn_up is [gate; up], as in its checkpoint.
_PHI3 = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# gpt-oss: the norm before the MLP is llama.cpp's attn_post_norm; the sinks are a bare parameter.
_GPT_OSS = {"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"}
_LAYER_OVERRIDES: dict[str, dict[str, str]] = {
    "gemma2": _SANDWICH,
    "gemma3": _SANDWICH,
    "olmo2": _OLMO2,
    "phi3": _PHI3,
    "gpt-oss": _GPT_OSS,
}
# Parameters that are no module's `weight`: the GGUF name's `.weight` is dropped.
_BARE_PARAMETERS = frozenset({"self_attn.sinks"})
# A mixture of experts' projections, each one tensor of all the layer's experts [E, N, K] (qwen3moe,
# Mixtral written as llama, gpt-oss): FusedMoE's w13 (gate rows, then up rows) and w2; gpt-oss's biases
# ([E, N]) fill w13_bias and w2_bias alike.
_EXPERT_PARTS: dict[str, tuple[str, int | None]] = {
    "ffn_gate_exps": ("w13", 0),
    "ffn_up_exps": ("w13", 1),
    "ffn_down_exps": ("w2", None),
}
_EXPERTS = re.compile(r"blk\.(\d+)\.(ffn_\w+_exps)\.(weight|bias)$")
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_TOP = re.compile(r"(\w+)\.(weight|bias)$")

# Tensors that carry no weight of the model but settings, which file.py reads into the config:
# Llama 3's RoPE frequency factors, Phi-3's LongRoPE factors.
IGNORED_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# The converter classes with llama.cpp's interleaved RoPE (LlamaModel and its subclasses with
# undo_permute) reorder q/k rows for it; the others keep Hugging Face's rotate-half order (NEOX).
PERMUTED_ARCHITECTURES = frozenset({"llama", "smollm3", "granite"})
# Gemma's RMSNorm multiplies by (1 + w); the converter writes w + 1 (llama.cpp multiplies by w).
NORM_PLUS_ONE_ARCHITECTURES = frozenset({"gemma2", "gemma3"})


@cache
def _layer_names(arch: str) -> dict[str, str]:
    return {**_LAYER_NAMES, **_LAYER_OVERRIDES.get(arch, {})}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face parameter name of a GGUF tensor of `arch` (None: not one Tram knows)."""
    m = _LAYER.match(gguf_name)
    if m:
        part = _layer_names(arch).get(m.group(2))
        if part is None:
            return None
        suffix = "" if part in _BARE_PARAMETERS and m.group(3) == "weight" else f".{m.group(3)}"
        return f"model.layers.{m.group(1)}.{part}{suffix}"
    m = _TOP.match(gguf_name)
    if m and m.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"
    return None


@dataclass(frozen=True)
class ExpertTensor:
    """Where a stacked expert tensor goes: FusedMoE `module`'s `param` ("w13" or "w2"), for w13 which
    `half` (0 gate, 1 up), and whether it is the `weight` or the `bias`."""

    module: str
    param: str
    half: int | None
    kind: str = "weight"


def expert_tensor(gguf_name: str) -> ExpertTensor | None:
    """The FusedMoE part a GGUF tensor fills (None: not a stacked expert tensor Tram knows)."""
    m = _EXPERTS.match(gguf_name)
    if m is None or m.group(2) not in _EXPERT_PARTS:
        return None
    param, half = _EXPERT_PARTS[m.group(2)]
    return ExpertTensor(f"model.layers.{m.group(1)}.mlp.experts", param, half, m.group(3))


def norm_plus_one(arch: str, gguf_name: str) -> bool:
    """Whether the converter added 1 to this tensor (as it does to every `*norm.weight` of Gemma)."""
    return arch in NORM_PLUS_ONE_ARCHITECTURES and gguf_name.endswith("norm.weight")


def unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's q/k permutation of a llama tensor's rows ([N, ...]): per head,
    rows (pair i, half j) go back from interleaved order to Hugging Face's rotate-half."""
    n = rows.shape[0]
    return rows.reshape(num_heads, n // num_heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
