"""Qwen3 (dense): the Llama decoder with an RMSNorm over head_dim on each q and k head, applied
after the projections and before RoPE, as transformers' modeling_qwen3.py does.

Unlike Qwen2, q/k/v carry a bias only when config.attention_bias says so (o_proj follows it too);
head_dim is explicit in the config (128 for every released size, whatever hidden_size / heads is),
which DecoderSpec reads. Sliding windows follow layer_types as for Qwen2.
"""

from __future__ import annotations

from tram.model.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qkv_bias = None
    qk_norm = True
