"""The shape of a model's mixture-of-experts layers, read once from its Hugging Face config.

Each family names the same things differently: Qwen3-MoE `num_experts` and `moe_intermediate_size`,
Mixtral and gpt-oss `num_local_experts` and `intermediate_size`. Torch-free: the engine's parallel
check reads it before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tram.config.parallel_check import expert_intermediate_size, num_experts

# How router logits become the weights of the chosen experts:
#   "softmax_topk": softmax over all experts, then the top k (Qwen3-MoE, Mixtral), optionally
#                   renormalised to sum to one;
#   "topk_softmax": the top k logits, then a softmax over those k (gpt-oss).
SCORING = ("softmax_topk", "topk_softmax")


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    renormalize: bool
    scoring: str = "softmax_topk"
    activation: str = "silu"  # or "swiglu_oai" (gpt-oss's clamped SwiGLU)
    bias: bool = False  # expert and router biases (gpt-oss)
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) must be between 1 and the number of experts ({self.num_experts})"
            )
        if self.intermediate_size < 1:
            raise ValueError(f"the experts' intermediate size must be positive, not {self.intermediate_size}")
        if self.scoring not in SCORING:
            raise ValueError(f"router scoring {self.scoring!r} is not one of {', '.join(SCORING)}")


def moe_spec(hf_config: Any, **family: Any) -> MoESpec:
    """The MoE spec of a Qwen3-MoE / Mixtral-style config; `family` overrides (scoring, activation...)."""
    norm = getattr(hf_config, "norm_topk_prob", None)
    kw: dict[str, Any] = dict(
        num_experts=num_experts(hf_config),
        top_k=int(hf_config.num_experts_per_tok),
        intermediate_size=expert_intermediate_size(hf_config),
        renormalize=True if norm is None else bool(norm),
    )
    kw.update(family)
    return MoESpec(**kw)
