"""Granite 3 (GraniteForCausalLM): the Llama decoder with four multipliers from its config, as
transformers' modeling_granite.py applies them:

  * embedding_multiplier scales the token embeddings;
  * residual_multiplier scales each sub-layer's output before its residual add;
  * attention_multiplier is the attention scale (in place of head_dim ** -0.5);
  * logits_scaling divides the logits.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import RMSNorm
from tram.model.layers.rope import RotaryEmbedding
from tram.model.models.base import CausalLM, DecoderModel, resolve_backend, spec_attention
from tram.model.pipeline import set_stage
from tram.model.spec import DecoderSpec


def _multiplier(hf_config: Any, name: str) -> float:
    """One of the four, 1.0 where the config leaves it out (GraniteConfig's default)."""
    return float(getattr(hf_config, name, 1.0))


class GraniteDecoderLayer(nn.Module):
    def __init__(
        self, hf_config: Any, spec: DecoderSpec, layer_idx: int, backend: AttentionBackend, dtype: torch.dtype
    ) -> None:
        super().__init__()
        norm = partial(RMSNorm, eps=spec.rms_norm_eps, dtype=dtype)
        self.input_layernorm = norm(spec.hidden_size)
        self.self_attn = spec_attention(
            spec, layer_idx, backend, dtype, scale=_multiplier(hf_config, "attention_multiplier")
        )
        self.post_attention_layernorm = norm(spec.hidden_size)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, spec.mlp_bias, dtype)
        # A Python float, as transformers multiplies by: the product is rounded once, in the activation dtype.
        self.residual_multiplier = _multiplier(hf_config, "residual_multiplier")

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        attn = self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        normed, h = self.post_attention_layernorm.add_forward(attn * self.residual_multiplier, h)
        return h + self.mlp(normed) * self.residual_multiplier


class GraniteModel(DecoderModel):
    def __init__(self, hf_config: Any, spec: DecoderSpec, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, dtype)
        # Not VocabEmbedding's scale, which rounds the normaliser to the dtype first (Gemma's way).
        self.embedding_multiplier = _multiplier(hf_config, "embedding_multiplier")
        self.layers = nn.ModuleList(
            GraniteDecoderLayer(hf_config, spec, i, backend, dtype) for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(hf_config, spec.head_dim)  # no parameters: nothing to load
        set_stage(self, 0, spec.num_layers, True, True)  # the whole model: one pipeline stage

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        return self.embed_tokens(input_ids) * self.embedding_multiplier


class GraniteForCausalLM(CausalLM):
    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        self.spec = DecoderSpec.from_hf_config(hf_config)
        self.dtype = dtype
        self.model = GraniteModel(hf_config, self.spec, resolve_backend(attention_backend), dtype)
        self.lm_head = LMHead(
            self.spec.hidden_size,
            self.spec.vocab_size,
            dtype,
            self.spec.tie_word_embeddings,
            logits_scaling=_multiplier(hf_config, "logits_scaling"),
        )
