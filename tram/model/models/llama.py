"""Llama and Mistral: pre-norm decoder layers of attention and a gated MLP, RMSNorm, one RoPE.

Qwen2, Qwen3, Phi-3 and SmolLM3 are this decoder with other switches (qwen2.py, qwen3.py, phi3.py,
smollm3.py): a subclass changes the switches, never the code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.cpu_decode import CpuDecodeLayer, cpu_decode_layer
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import RMSNorm
from tram.model.layers.rope import RotaryEmbedding
from tram.model.models.base import CausalLM, DecoderModel, resolve_backend, spec_attention
from tram.model.pipeline import set_stage
from tram.model.spec import DecoderSpec


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        spec: DecoderSpec,
        layer_idx: int,
        backend: AttentionBackend,
        dtype: torch.dtype,
        qk_norm: bool,
        use_rope: bool = True,
        mlp: nn.Module | None = None,
        attention_extras: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.use_rope = use_rope  # False: attention without positions (SmolLM3's NoPE layers)
        norm = partial(RMSNorm, eps=spec.rms_norm_eps, dtype=dtype)
        self.input_layernorm = norm(spec.hidden_size)
        head_norm = norm if qk_norm else None
        self.self_attn = spec_attention(
            spec, layer_idx, backend, dtype, head_norm=head_norm, **(attention_extras or {})
        )
        self.post_attention_layernorm = norm(spec.hidden_size)
        # A family's own MLP (a mixture of experts) or the dense gated one.
        self.mlp = mlp or GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, spec.mlp_bias, dtype)
        # The decode step with its kernels chosen once (layers/cpu_decode.py): built at the first forward,
        # False where it cannot run (another device, no kernels).
        self.cpu_decode: CpuDecodeLayer | bool | None = None

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        out, residual = self.forward_residual(h, None, cos, sin, kv_cache, meta)
        return residual + out

    def forward_residual(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer on h = residual + x (x alone where residual is None), returned as (the MLP's output,
        the residual it adds to): the add joins the next norm's call (DecoderModel.forward)."""
        if self.cpu_decode is None:
            self.cpu_decode = cpu_decode_layer(self, x) or False
        if self.cpu_decode:
            out = self.cpu_decode(x, residual, cos, sin, kv_cache, meta)
            if out is not None:
                return out
        if not self.use_rope:
            cos = sin = None
        if residual is None:
            normed, residual = self.input_layernorm(x), x
        else:
            normed, residual = self.input_layernorm.add_forward(x, residual)
        normed, residual = self.post_attention_layernorm.add_forward(
            self.self_attn(normed, cos, sin, kv_cache, meta), residual
        )
        return self.mlp(normed), residual


class LlamaModel(DecoderModel):
    def __init__(
        self,
        hf_config: Any,
        spec: DecoderSpec,
        backend: AttentionBackend,
        dtype: torch.dtype,
        qk_norm: bool = False,
        rope_layers: Sequence[bool] | None = None,
        mlp_for: Callable[[int], nn.Module | None] | None = None,
        attention_extras: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        rope_layers = rope_layers or [True] * spec.num_layers
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                spec, i, backend, dtype, qk_norm, rope_layers[i], mlp_for(i) if mlp_for else None, attention_extras
            )
            for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(hf_config, spec.head_dim)  # no parameters: nothing to load
        set_stage(self, 0, spec.num_layers, True, True)  # the whole model: one pipeline stage


class LlamaForCausalLM(CausalLM):
    """Llama; the class switches below are what Mistral, Qwen2 and Qwen3 change."""

    qkv_bias: bool | None = None  # None: follow config.attention_bias
    qk_norm: bool = False  # RMSNorm of each q and k head before RoPE
    attention_extras: ClassVar[dict[str, Any]] = {}  # the family's own Attention arguments (gpt-oss's sinks)

    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        self.spec = DecoderSpec.from_hf_config(hf_config, qkv_bias=self.qkv_bias)
        self.dtype = dtype
        backend = resolve_backend(attention_backend)
        rope_layers = self.rope_layers(hf_config)
        self.model = LlamaModel(
            hf_config,
            self.spec,
            backend,
            dtype,
            self.qk_norm,
            rope_layers,
            lambda i: self.layer_mlp(hf_config, i),
            self.attention_extras,
        )
        self.lm_head = LMHead(self.spec.hidden_size, self.spec.vocab_size, dtype, self.spec.tie_word_embeddings)

    @staticmethod
    def rope_layers(hf_config: Any) -> list[bool] | None:
        """Whether each layer rotates q and k (None: every layer does)."""
        return None

    def layer_mlp(self, hf_config: Any, layer_idx: int) -> nn.Module | None:
        """Layer layer_idx's MLP where the family's differs from the dense gated one (None: dense)."""
        return None


class MistralForCausalLM(LlamaForCausalLM):
    """Llama with an optional sliding window (config.sliding_window), which the spec already reads."""
