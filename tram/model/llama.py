"""The Llama family (Llama, Mistral, Qwen2) over a flattened, paged batch.

Module and parameter names equal the Hugging Face checkpoint names, so loading is a name match.
The families differ only in a few switches (q/k/v bias, sliding window), gathered in `DecoderSpec`;
a subclass changes the switches, never the code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata, get_attention_backend
from tram.model.linear import Linear, linear, linear_n
from tram.model.cpu_kernels import kernels_for
from tram.model.rope import RotaryEmbedding, apply_rotary_qk

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def attention_dims(hf_config: Any) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim); head_dim may differ from hidden_size / num_heads."""
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads)
    return num_heads, num_kv_heads, head_dim


def layer_sliding_windows(hf_config: Any) -> tuple[int | None, ...]:
    """The sliding window of each layer, None for full attention.

    Qwen2 switches windows off with use_sliding_window and limits them to some layers, listed in
    layer_types (transformers >= 4.53) or implied by max_window_layers (older configs).
    """
    num_layers = int(hf_config.num_hidden_layers)
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return (None,) * num_layers
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    first = int(getattr(hf_config, "max_window_layers", 0) or 0)
    return tuple(window if i >= first else None for i in range(num_layers))


@dataclass(frozen=True)
class DecoderSpec:
    """The shape and switches of a Llama-style decoder, read once from the Hugging Face config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    sliding_windows: tuple[int | None, ...]

    @classmethod
    def from_hf_config(cls, hf_config: Any, qkv_bias: bool | None = None) -> DecoderSpec:
        num_heads, num_kv_heads, head_dim = attention_dims(hf_config)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        act = getattr(hf_config, "hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        return cls(
            vocab_size=int(hf_config.vocab_size),
            hidden_size=int(hf_config.hidden_size),
            intermediate_size=int(hf_config.intermediate_size),
            num_layers=int(hf_config.num_hidden_layers),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
            hidden_act=act,
            qkv_bias=attention_bias if qkv_bias is None else qkv_bias,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            sliding_windows=layer_sliding_windows(hf_config),
        )


class RMSNorm(nn.Module):
    """Root-mean-square norm as Hugging Face computes it: statistics in float32, then cast back."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        kernels = kernels_for(x)
        if kernels is not None:  # one C++ call instead of seven ops (csrc/rms_norm.cpp)
            return kernels.rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the residual add fused into the norm on CPU."""
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.add_rms_norm(x, residual, self.weight, self.eps)
        h = residual + x
        return self.forward(h), h


class LlamaMLP(nn.Module):
    def __init__(self, spec: DecoderSpec, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, inter, bias = spec.hidden_size, spec.intermediate_size, spec.mlp_bias
        self.gate_proj = Linear(hidden, inter, bias=bias, dtype=dtype)
        self.up_proj = Linear(hidden, inter, bias=bias, dtype=dtype)
        self.down_proj = Linear(inter, hidden, bias=bias, dtype=dtype)
        self.act = _ACTIVATIONS[spec.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        gate, up = linear_n(x, (self.gate_proj, self.up_proj))
        return self.down_proj(self.act(gate) * up)


class LlamaAttention(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_idx: int, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = self.head_dim ** -0.5
        self.sliding_window = spec.sliding_windows[layer_idx]
        self.backend = backend
        hidden, q_size, kv_size = spec.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = Linear(hidden, q_size, bias=spec.qkv_bias, dtype=dtype)
        self.k_proj = Linear(hidden, kv_size, bias=spec.qkv_bias, dtype=dtype)
        self.v_proj = Linear(hidden, kv_size, bias=spec.qkv_bias, dtype=dtype)
        self.o_proj = Linear(q_size, hidden, bias=spec.o_bias, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:  # x [T, hidden] -> [T, hidden]
        num_tokens = x.shape[0]
        q, k, v = linear_n(x, (self.q_proj, self.k_proj, self.v_proj))
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        q, k = apply_rotary_qk(q, k, cos, sin)
        out = self.backend.forward(q, k, v, kv_cache, meta, self.scale, self.sliding_window)  # [T, H, D]
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))  # [T, hidden]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_idx: int, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(spec, layer_idx, backend, dtype)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.mlp = LlamaMLP(spec, dtype)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        normed, h = self.post_attention_layernorm.add_forward(
            self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta), h)
        return h + self.mlp(normed)


class LlamaModel(nn.Module):
    def __init__(self, hf_config: Any, spec: DecoderSpec, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(spec, i, backend, dtype) for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(hf_config, spec.head_dim)  # no parameters: nothing to load

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:  # input_ids, positions [T] -> [T, hidden]
        h = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary_emb.cos_sin(positions, h.dtype)  # [T, 1, rotary_dim] each, shared by layers
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, kv_cache, meta)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    """A Llama-style causal LM on a flattened variable-length batch with a paged KV cache.

    forward(input_ids [T], positions [T], kv_caches (one [2, num_blocks, block_size, Hkv, D] tensor per
    layer), meta) -> hidden [T, hidden_size]; compute_logits(hidden [N, hidden_size]) -> [N, vocab] float32.
    """

    # Subclasses override the switches that differ from Llama's config-driven defaults.
    qkv_bias: bool | None = None  # None: follow config.attention_bias

    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        backend = (get_attention_backend(attention_backend) if isinstance(attention_backend, str)
                   else attention_backend)
        self.spec = DecoderSpec.from_hf_config(hf_config, qkv_bias=self.qkv_bias)
        self.dtype = dtype
        self.model = LlamaModel(hf_config, self.spec, backend, dtype)
        if not self.spec.tie_word_embeddings:
            self.lm_head = Linear(self.spec.hidden_size, self.spec.vocab_size, bias=False, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        weight = self.model.embed_tokens.weight if self.spec.tie_word_embeddings else self.lm_head.weight
        return linear(hidden, weight).float()


class MistralForCausalLM(LlamaForCausalLM):
    """Llama with an optional sliding window (config.sliding_window), which the spec already reads."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Llama with biases on q/k/v (never on o_proj) and per-layer sliding windows."""

    qkv_bias = True
