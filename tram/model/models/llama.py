"""Llama and Mistral: pre-norm decoder layers of attention and a gated MLP, RMSNorm, one RoPE.

Qwen2 and Qwen3 are this decoder with other switches (qwen2.py, qwen3.py): a subclass changes the
switches, never the code.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.attention import Attention
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import RMSNorm
from tram.model.layers.rope import RotaryEmbedding
from tram.model.models.base import CausalLM, resolve_backend
from tram.model.pipeline import set_stage
from tram.model.spec import DecoderSpec


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, spec: DecoderSpec, layer_idx: int, backend: AttentionBackend, dtype: torch.dtype, qk_norm: bool
    ) -> None:
        super().__init__()
        norm = partial(RMSNorm, eps=spec.rms_norm_eps, dtype=dtype)
        self.input_layernorm = norm(spec.hidden_size)
        self.self_attn = Attention(
            spec.hidden_size,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
            backend,
            dtype,
            qkv_bias=spec.qkv_bias,
            o_bias=spec.o_bias,
            sliding_window=spec.sliding_windows[layer_idx],
            head_norm=norm if qk_norm else None,
        )
        self.post_attention_layernorm = norm(spec.hidden_size)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, spec.mlp_bias, dtype)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        normed, h = self.post_attention_layernorm.add_forward(
            self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta), h
        )
        return h + self.mlp(normed)


class LlamaModel(nn.Module):
    def __init__(
        self, hf_config: Any, spec: DecoderSpec, backend: AttentionBackend, dtype: torch.dtype, qk_norm: bool = False
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, i, backend, dtype, qk_norm) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(hf_config, spec.head_dim)  # no parameters: nothing to load
        set_stage(self, 0, spec.num_layers, True, True)  # the whole model: one pipeline stage

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # input_ids, positions [T] -> [T, hidden]; `hidden` is the previous pipeline stage's output
        h = self.embed_tokens(input_ids) if self.pp_first else hidden  # [T, hidden]
        cos, sin = self.rotary_emb.cos_sin(positions, h.dtype)  # [T, 1, rotary_dim] each, shared by layers
        for layer, kv_cache in zip(self.local_layers, kv_caches, strict=True):
            h = layer(h, cos, sin, kv_cache, meta)
        return self.norm(h) if self.pp_last else h


class LlamaForCausalLM(CausalLM):
    """Llama; the class switches below are what Mistral, Qwen2 and Qwen3 change."""

    qkv_bias: bool | None = None  # None: follow config.attention_bias
    qk_norm: bool = False  # RMSNorm of each q and k head before RoPE

    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        self.spec = DecoderSpec.from_hf_config(hf_config, qkv_bias=self.qkv_bias)
        self.dtype = dtype
        self.model = LlamaModel(hf_config, self.spec, resolve_backend(attention_backend), dtype, self.qk_norm)
        self.lm_head = LMHead(self.spec.hidden_size, self.spec.vocab_size, dtype, self.spec.tie_word_embeddings)


class MistralForCausalLM(LlamaForCausalLM):
    """Llama with an optional sliding window (config.sliding_window), which the spec already reads."""
