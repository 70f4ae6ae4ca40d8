"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder with a sparse MoE block in place of
the MLP: a softmax router over num_experts, the top num_experts_per_tok experts, renormalised where
norm_topk_prob says so (transformers' modeling_qwen3_moe.py). Layers in mlp_only_layers, and those
off the decoder_sparse_step period, keep a dense MLP of intermediate_size.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tram.model.layers.moe.block import SparseMoEBlock
from tram.model.layers.moe.spec import moe_spec
from tram.model.models.qwen3 import Qwen3ForCausalLM


def is_sparse_layer(hf_config: Any, layer_idx: int) -> bool:
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    dense = getattr(hf_config, "mlp_only_layers", None) or ()
    return layer_idx not in dense and (layer_idx + 1) % step == 0


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def layer_mlp(self, hf_config: Any, layer_idx: int) -> nn.Module | None:
        if not is_sparse_layer(hf_config, layer_idx):
            return None
        return SparseMoEBlock(moe_spec(hf_config), self.spec.hidden_size, self.dtype)
