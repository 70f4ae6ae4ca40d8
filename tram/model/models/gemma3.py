"""Gemma 3, the text model (Gemma3ForCausalLM, config model_type gemma3_text), as transformers'
modeling_gemma3.py computes it:

  * embeddings scaled by sqrt(hidden_size) (the normaliser rounded to the activation dtype);
  * Gemma's RMSNorm, (1 + w) in float32, four per layer around attention and MLP ("sandwich"),
    and one per q and k head before RoPE;
  * attention scale query_pre_attn_scalar ** -0.5; GeGLU MLP (hidden_activation);
  * sliding-window and global layers alternating as config.layer_types lists them, each kind with
    its own RoPE (a local and a global base), computed once per step;
  * tied embeddings, and final_logit_softcapping on the logits when configured.

Tram's attention kernels take no logit soft-capping, so a config with attn_logit_softcapping fails
at build rather than computing something else.
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
from tram.model.layers.norm import GemmaRMSNorm
from tram.model.layers.rope import LayerTypeRotaryEmbedding
from tram.model.models.base import CausalLM, resolve_backend
from tram.model.pipeline import set_stage
from tram.model.spec import DecoderSpec

RopeByLayerType = dict[str, tuple[torch.Tensor, torch.Tensor]]


def check_gemma3_config(hf_config: Any) -> None:
    """ValueError for settings Tram cannot compute as transformers does."""
    if getattr(hf_config, "attn_logit_softcapping", None) is not None:
        raise ValueError(
            f"Gemma 3 config sets attn_logit_softcapping={hf_config.attn_logit_softcapping}, "
            "which Tram's attention kernels do not support"
        )
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ValueError(
            "Gemma 3 config sets use_bidirectional_attention (an encoder), which a causal "
            "LM with a KV cache cannot serve"
        )


class Gemma3DecoderLayer(nn.Module):
    def __init__(
        self, hf_config: Any, spec: DecoderSpec, layer_idx: int, backend: AttentionBackend, dtype: torch.dtype
    ) -> None:
        super().__init__()
        norm = partial(GemmaRMSNorm, eps=spec.rms_norm_eps, dtype=dtype)
        self.layer_type = spec.layer_types[layer_idx]
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
            scale=float(hf_config.query_pre_attn_scalar) ** -0.5,
            sliding_window=spec.sliding_windows[layer_idx],
            head_norm=norm,
        )
        self.post_attention_layernorm = norm(spec.hidden_size)
        self.pre_feedforward_layernorm = norm(spec.hidden_size)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, False, dtype)
        self.post_feedforward_layernorm = norm(spec.hidden_size)

    def forward(
        self, h: torch.Tensor, ropes: RopeByLayerType, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        cos, sin = ropes[self.layer_type]
        attn = self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        h = h + self.post_attention_layernorm(attn)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Gemma3TextModel(nn.Module):
    def __init__(self, hf_config: Any, spec: DecoderSpec, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, dtype, scale=spec.hidden_size**0.5)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(hf_config, spec, i, backend, dtype) for i in range(spec.num_layers)
        )
        self.norm = GemmaRMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.rotary_emb = LayerTypeRotaryEmbedding(hf_config, spec.head_dim, spec.layer_types)  # no parameters
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
        ropes = self.rotary_emb.cos_sin(positions, h.dtype)  # per layer type: [T, 1, rotary_dim] each
        for layer, kv_cache in zip(self.local_layers, kv_caches, strict=True):
            h = layer(h, ropes, kv_cache, meta)
        return self.norm(h) if self.pp_last else h


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        check_gemma3_config(hf_config)
        self.spec = DecoderSpec.from_hf_config(hf_config)
        self.dtype = dtype
        self.model = Gemma3TextModel(hf_config, self.spec, resolve_backend(attention_backend), dtype)
        softcap = getattr(hf_config, "final_logit_softcapping", None)
        self.lm_head = LMHead(
            self.spec.hidden_size,
            self.spec.vocab_size,
            dtype,
            self.spec.tie_word_embeddings,
            final_logit_softcapping=None if softcap is None else float(softcap),
        )
