"""Qwen2: the Llama decoder with biases on q/k/v (never on o_proj) and sliding windows on some layers
(use_sliding_window, max_window_layers / layer_types, read by DecoderSpec)."""

from __future__ import annotations

from tram.model.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
