"""Phi-3 and Phi-4-mini (Phi3ForCausalLM): the Llama decoder, whose checkpoint stacks q, k and v in
one `qkv_proj` tensor and gate and up in one `gate_up_proj`.

Tram keeps its separate linears and cuts the stacked tensors into them while loading
(`fused_weights`, weight_utils.fused_parts): q, k, v rows in that order, then gate before up, as
transformers' modeling_phi3.py splits them. Each rank of a tensor-parallel group then takes its share
of each part as for Llama.

LongRoPE (rope_type longrope: short and long factors, original_max_position_embeddings) and partial
rotary (partial_rotary_factor, 0.75 in Phi-4-mini) live in layers/rope.py; a config's sliding_window,
which Phi-3 applies to every layer, is read by DecoderSpec.
"""

from __future__ import annotations

from typing import ClassVar

from tram.model.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    fused_weights: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }
