"""SmolLM3 (SmolLM3ForCausalLM): the Llama decoder in which some layers attend without RoPE (NoPE).

transformers' modeling_smollm3.py rotates q and k in layer i when config.no_rope_layers[i] is 1 (the
list names the layers that *use* RoPE, despite its name). A config without the list builds it from
no_rope_layer_interval: every interval-th layer, counting from one, goes without (layers 3, 7, 11, ...
from zero, for the interval of 4). Sliding windows, where use_sliding_window asks for them, follow
layer_types as for Qwen2, which DecoderSpec reads.
"""

from __future__ import annotations

from typing import Any

from tram.model.models.llama import LlamaForCausalLM


def smollm3_rope_layers(hf_config: Any) -> list[bool]:
    """Whether each layer rotates q and k, as transformers' SmolLM3Config derives it."""
    listed = getattr(hf_config, "no_rope_layers", None)
    num_layers = int(hf_config.num_hidden_layers)
    if listed is None:
        interval = int(getattr(hf_config, "no_rope_layer_interval", 4))
        return [(i + 1) % interval != 0 for i in range(num_layers)]
    if len(listed) != num_layers:
        raise ValueError(f"no_rope_layers has {len(listed)} entries for {num_layers} layers")
    return [bool(flag) for flag in listed]


class SmolLM3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def rope_layers(hf_config: Any) -> list[bool] | None:
        return smollm3_rope_layers(hf_config)
