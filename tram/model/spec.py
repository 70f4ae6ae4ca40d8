"""The shape of a decoder, read once from a Hugging Face config, so that layers never read configs.

Families read their own extras (Gemma's attention scalar, logit soft-capping) in their own files;
what every decoder-only family shares lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tram.model.layers.activation import check_activation

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def attention_dims(hf_config: Any) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim); head_dim may differ from hidden_size / num_heads."""
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads)
    return num_heads, num_kv_heads, head_dim


def layer_sliding_windows(hf_config: Any) -> tuple[int | None, ...]:
    """The sliding window of each layer, None for full attention.

    Qwen2 switches windows off with use_sliding_window and limits them to some layers, listed in
    layer_types (transformers >= 4.53) or implied by max_window_layers (older configs). Gemma 3
    lists them in layer_types and has no use_sliding_window; Gemma 2 before transformers 4.53 lists
    none, and its even layers slide.
    """
    num_layers = int(hf_config.num_hidden_layers)
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return (None,) * num_layers
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types:
        return tuple(window if t == SLIDING_ATTENTION else None for t in layer_types)
    if getattr(hf_config, "model_type", None) == "gemma2":
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    first = int(getattr(hf_config, "max_window_layers", 0) or 0)
    return tuple(window if i >= first else None for i in range(num_layers))


def read_layer_types(hf_config: Any) -> tuple[str, ...]:
    """Each layer's attention kind as transformers names it; derived from the windows when not listed."""
    listed = getattr(hf_config, "layer_types", None)
    if listed:
        return tuple(str(t) for t in listed)
    return tuple(FULL_ATTENTION if w is None else SLIDING_ATTENTION for w in layer_sliding_windows(hf_config))


def activation_name(hf_config: Any) -> str:
    """Gemma names its activation hidden_activation; the others hidden_act (silu when absent)."""
    return getattr(hf_config, "hidden_activation", None) or getattr(hf_config, "hidden_act", None) or "silu"


@dataclass(frozen=True)
class DecoderSpec:
    """The shape and switches of a decoder-only transformer with gated MLPs and RMSNorm."""

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
    layer_types: tuple[str, ...]  # config.layer_types; families with a RoPE per layer type key on it

    @classmethod
    def from_hf_config(cls, hf_config: Any, qkv_bias: bool | None = None) -> DecoderSpec:
        """qkv_bias None follows config.attention_bias (as o_proj always does)."""
        num_heads, num_kv_heads, head_dim = attention_dims(hf_config)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            )
        act = check_activation(activation_name(hf_config))
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
            layer_types=read_layer_types(hf_config),
        )
