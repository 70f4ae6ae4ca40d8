"""OLMo 2 (Olmo2ForCausalLM), as transformers' modeling_olmo2.py computes it:

* post-norms: each sub-layer's output is normed before its residual add, and no input is normed
  (h = h + norm(attn(h)); h = h + norm(mlp(h)));
* q and k each normed over the whole projection (num_heads * head_dim features), not per head,
  before RoPE; under tensor parallelism the ranks share the mean of squares (ShardedRowRMSNorm);
* every RMSNorm multiplies by its weight in float32 before rounding (Float32WeightRMSNorm);
* one RoPE, a gated MLP and an untied LM head, as Llama's.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from tram.distributed import get_tp, shard_range
from tram.distributed.parallel_state import kv_head_range
from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.attention import Attention
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import Float32WeightRMSNorm, ShardedRowRMSNorm
from tram.model.layers.rope import RotaryEmbedding
from tram.model.models.base import CausalLM, DecoderModel, resolve_backend, spec_attention
from tram.model.pipeline import set_stage
from tram.model.spec import DecoderSpec


class Olmo2Attention(Attention):
    """Attention whose q_norm and k_norm span all of this rank's heads (and, summed, every rank's)."""

    def __init__(self, decoder: DecoderSpec, **attention_args: Any) -> None:
        super().__init__(**attention_args)
        num_heads, num_kv_heads, head_dim = decoder.num_heads, decoder.num_kv_heads, decoder.head_dim
        tp, d = get_tp(), head_dim
        q_start, _ = shard_range(num_heads, tp.rank, tp.size)
        kv_start, _ = kv_head_range(num_heads, num_kv_heads, tp.rank, tp.size)
        kv_replicas = tp.size * self.num_kv_heads // num_kv_heads  # > 1 when ranks outnumber KV heads
        norm = partial(ShardedRowRMSNorm, eps=decoder.rms_norm_eps, dtype=attention_args["dtype"])
        self.q_norm = norm(num_heads * d, q_start * d, self.num_heads * d)
        self.k_norm = norm(num_kv_heads * d, kv_start * d, self.num_kv_heads * d, replicas=kv_replicas)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)  # [T, H * D], [T, Hkv * D]: whole rows


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_idx: int, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        norm = partial(Float32WeightRMSNorm, eps=spec.rms_norm_eps, dtype=dtype)
        self.self_attn = spec_attention(spec, layer_idx, backend, dtype, Olmo2Attention, decoder=spec)
        self.post_attention_layernorm = norm(spec.hidden_size)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, spec.mlp_bias, dtype)
        self.post_feedforward_layernorm = norm(spec.hidden_size)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        h = h + self.post_attention_layernorm(self.self_attn(h, cos, sin, kv_cache, meta))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class Olmo2Model(DecoderModel):
    def __init__(self, hf_config: Any, spec: DecoderSpec, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size, dtype)
        self.layers = nn.ModuleList(Olmo2DecoderLayer(spec, i, backend, dtype) for i in range(spec.num_layers))
        self.norm = Float32WeightRMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(hf_config, spec.head_dim)  # no parameters: nothing to load
        set_stage(self, 0, spec.num_layers, True, True)  # the whole model: one pipeline stage


class Olmo2ForCausalLM(CausalLM):
    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__()
        self.spec = DecoderSpec.from_hf_config(hf_config)
        self.dtype = dtype
        self.model = Olmo2Model(hf_config, self.spec, resolve_backend(attention_backend), dtype)
        self.lm_head = LMHead(self.spec.hidden_size, self.spec.vocab_size, dtype, self.spec.tie_word_embeddings)
