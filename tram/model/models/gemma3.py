"""Gemma 3, the text model (Gemma3ForCausalLM, config model_type gemma3_text), as transformers'
modeling_gemma3.py computes it:

  * embeddings scaled by sqrt(hidden_size) (the normaliser rounded to the activation dtype);
  * Gemma's RMSNorm, (1 + w) in float32, four per layer around attention and MLP ("sandwich"),
    and one per q and k head before RoPE;
  * attention scale query_pre_attn_scalar ** -0.5; GeGLU MLP (hidden_activation);
  * sliding-window and global layers alternating as config.layer_types lists them, each kind with
    its own RoPE (a local and a global base), computed once per step;
  * final_logit_softcapping on the logits when configured; tied embeddings.

attn_logit_softcapping is accepted and, as in transformers' Gemma 3, not applied: transformers reads
it but never hands it to attention (released Gemma 3 configs leave it null; the q/k norms took the
cap's place). Gemma 2 (gemma2.py) is this decoder without the q/k norms, with one RoPE for every
layer and with the attention soft-cap applied: the classes here take those differences as
`qk_norm` and `caps_attention`.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.cpu_decode import GemmaDecodeLayer, gemma_decode_layer
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import GemmaRMSNorm
from tram.model.layers.rope import LayerTypeRotaryEmbedding
from tram.model.models.base import CausalLM, DecoderModel, resolve_backend, spec_attention
from tram.model.pipeline import set_stage
from tram.model.spec import DecoderSpec

logger = logging.getLogger(__name__)

RopeByLayerType = dict[str, tuple[torch.Tensor, torch.Tensor]]


def check_gemma_config(hf_config: Any) -> None:
    """ValueError for settings Tram cannot compute as transformers does."""
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        cap = optional_float(hf_config, name)
        if cap is not None and not cap > 0:  # tanh(x / cap) * cap: 0 gives NaN, a negative cap flips signs
            raise ValueError(f"{type(hf_config).__name__} sets {name}={cap}; a soft-cap must be positive or null")
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ValueError(
            f"{type(hf_config).__name__} sets use_bidirectional_attention (an encoder), which a causal "
            "LM with a KV cache cannot serve"
        )


def optional_float(hf_config: Any, name: str) -> float | None:
    """A soft-cap setting as a float, None when absent or null (off)."""
    value = getattr(hf_config, name, None)
    return None if value is None else float(value)


class Gemma3DecoderLayer(nn.Module):
    def __init__(
        self,
        hf_config: Any,
        spec: DecoderSpec,
        layer_idx: int,
        backend: AttentionBackend,
        dtype: torch.dtype,
        qk_norm: bool = True,
        attn_soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        norm = partial(GemmaRMSNorm, eps=spec.rms_norm_eps, dtype=dtype)
        self.layer_type = spec.layer_types[layer_idx]
        self.input_layernorm = norm(spec.hidden_size)
        self.self_attn = spec_attention(
            spec,
            layer_idx,
            backend,
            dtype,
            scale=float(hf_config.query_pre_attn_scalar) ** -0.5,
            head_norm=norm if qk_norm else None,
            logits_soft_cap=attn_soft_cap,
        )
        self.post_attention_layernorm = norm(spec.hidden_size)
        self.pre_feedforward_layernorm = norm(spec.hidden_size)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, False, dtype)
        self.post_feedforward_layernorm = norm(spec.hidden_size)
        # The decode step with its kernels chosen once (layers/cpu_decode.py), as Llama's layer.
        self.cpu_decode: GemmaDecodeLayer | bool | None = None

    def forward(
        self, h: torch.Tensor, ropes: RopeByLayerType, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        if self.cpu_decode is None:
            self.cpu_decode = gemma_decode_layer(self, h) or False
        if self.cpu_decode:
            out = self.cpu_decode(h, ropes, kv_cache, meta)
            if out is not None:
                return out
        cos, sin = ropes[self.layer_type]
        attn = self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        h, x = self.post_attention_layernorm.norm_add(attn, h, self.pre_feedforward_layernorm)
        assert x is not None
        h, _ = self.post_feedforward_layernorm.norm_add(self.mlp(x), h)
        return h


class Gemma3TextModel(DecoderModel):
    def __init__(
        self,
        hf_config: Any,
        spec: DecoderSpec,
        backend: AttentionBackend,
        dtype: torch.dtype,
        qk_norm: bool = True,
        attn_soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, dtype, scale=spec.hidden_size**0.5)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(hf_config, spec, i, backend, dtype, qk_norm, attn_soft_cap)
            for i in range(spec.num_layers)
        )
        self.norm = GemmaRMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        # No parameters; Gemma 2's two layer types share one RoPE table.
        self.rotary_emb = LayerTypeRotaryEmbedding(hf_config, spec.head_dim, spec.layer_types)
        set_stage(self, 0, spec.num_layers, True, True)  # the whole model: one pipeline stage

    def position_args(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[RopeByLayerType]:
        return (self.rotary_emb.cos_sin(positions, dtype),)  # per layer type: [T, 1, rotary_dim] each


class Gemma3ForCausalLM(CausalLM):
    qk_norm = True  # an RMSNorm on each q and k head before RoPE
    caps_attention = False  # whether attn_logit_softcapping soft-caps the scores (see the module doc)

    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        check_gemma_config(hf_config)
        self.spec = DecoderSpec.from_hf_config(hf_config)
        self.dtype = dtype
        backend = resolve_backend(attention_backend)
        attn_soft_cap = self.attention_soft_cap(hf_config)
        self.model = Gemma3TextModel(hf_config, self.spec, backend, dtype, self.qk_norm, attn_soft_cap)
        self.lm_head = LMHead(
            self.spec.hidden_size,
            self.spec.vocab_size,
            dtype,
            self.spec.tie_word_embeddings,
            final_logit_softcapping=optional_float(hf_config, "final_logit_softcapping"),
        )

    def attention_soft_cap(self, hf_config: Any) -> float | None:
        """The cap on attention scores: attn_logit_softcapping where the family applies it, else None."""
        cap = optional_float(hf_config, "attn_logit_softcapping")
        if cap is not None and not self.caps_attention:
            logger.warning(
                "%s: attn_logit_softcapping=%s is not applied, as transformers does not apply it either",
                type(self).__name__,
                cap,
            )
            return None
        return cap
