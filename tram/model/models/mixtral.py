"""Mixtral: Mistral's decoder with a sparse MoE block (softmax router, top-2 of 8, always
renormalised). Its checkpoints name the block `block_sparse_moe` and the experts' projections
w1 (gate), w3 (up) and w2 (down); Tram's layer is `mlp` with stacked experts.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from tram.model.layers.moe.block import SparseMoEBlock
from tram.model.layers.moe.layer import MIXTRAL_EXPERT_NAMES
from tram.model.layers.moe.spec import moe_spec
from tram.model.models.llama import MistralForCausalLM


class MixtralForCausalLM(MistralForCausalLM):
    checkpoint_renames: ClassVar[tuple[tuple[str, str], ...]] = ((".block_sparse_moe.", ".mlp."),)

    def layer_mlp(self, hf_config: Any, layer_idx: int) -> nn.Module | None:
        spec = moe_spec(hf_config, renormalize=True)
        return SparseMoEBlock(spec, self.spec.hidden_size, self.dtype, MIXTRAL_EXPERT_NAMES)
