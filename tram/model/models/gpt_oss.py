"""gpt-oss (OpenAI's gpt-oss-20b and -120b): a pre-norm decoder whose layers alternate a sliding
window of 128 tokens with full attention, each head with a learned sink logit in its softmax, q/k/v/o
with biases, YaRN RoPE, and a mixture of experts in every layer: the top-k router logits (with a
bias) softmaxed over the k chosen, experts with biases and a clamped SwiGLU,
(up + 1) * gate * sigmoid(1.702 * gate) (transformers' modeling_gpt_oss.py).

Its checkpoints stack the experts, in MXFP4 as released (dequantized at load: layers/moe/stacked.py),
and name the router `mlp.router`, Tram's SparseMoEBlock `mlp.gate`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from tram.model.layers.moe.block import SparseMoEBlock
from tram.model.layers.moe.spec import moe_spec
from tram.model.layers.moe.stacked import StackedFusedMoE
from tram.model.models.llama import LlamaForCausalLM


class GptOssForCausalLM(LlamaForCausalLM):
    checkpoint_renames: ClassVar[tuple[tuple[str, str], ...]] = ((".mlp.router.", ".mlp.gate."),)
    attention_extras: ClassVar[dict[str, Any]] = {"sinks": True}

    def layer_mlp(self, hf_config: Any, layer_idx: int) -> nn.Module | None:
        spec = moe_spec(
            hf_config,
            renormalize=False,
            scoring="topk_softmax",
            activation="swiglu_oai",
            bias=True,
            swiglu_alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
            swiglu_limit=float(getattr(hf_config, "swiglu_limit", 7.0)),
        )
        return SparseMoEBlock(spec, self.spec.hidden_size, self.dtype, experts_cls=StackedFusedMoE)
