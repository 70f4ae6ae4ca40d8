"""Gemma 2 (Gemma2ForCausalLM), as transformers' modeling_gemma2.py computes it.

It is Gemma 3's decoder (gemma3.py): embeddings scaled by sqrt(hidden_size), Gemma's (1 + w) RMSNorm
before and after attention and the MLP ("sandwich"), attention scale query_pre_attn_scalar ** -0.5,
GeGLU, sliding-window and global layers alternating as config.layer_types lists them, scores
soft-capped by attn_logit_softcapping (cap * tanh(score / cap) before the mask and softmax, in every
attention backend), logits by final_logit_softcapping, and tied embeddings. What differs: no norm on
the q and k heads, and one RoPE for every layer (its two layer types share one table).
"""

from __future__ import annotations

from tram.model.models.gemma3 import Gemma3ForCausalLM


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    qk_norm = False
    caps_attention = True
