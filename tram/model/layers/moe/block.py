"""The sparse MoE block of Qwen3-MoE and Mixtral (and gpt-oss, with biases): router, then experts.

Names are Qwen3-MoE's (`mlp.gate`, `mlp.experts.<e>.<projection>`); Mixtral's checkpoints name the
block `block_sparse_moe` and its projections w1/w3/w2, gpt-oss's its router `mlp.router` and stacks
its experts (stacked.py): their family files map them.
"""

from __future__ import annotations

import torch
from torch import nn

from tram.model.layers.moe.layer import FusedMoE
from tram.model.layers.moe.router import Router, select_experts
from tram.model.layers.moe.spec import MoESpec


class SparseMoEBlock(nn.Module):
    def __init__(
        self,
        spec: MoESpec,
        hidden_size: int,
        dtype: torch.dtype,
        expert_names: dict[str, tuple[str, int | None]] | None = None,
        experts_cls: type[FusedMoE] = FusedMoE,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.gate = Router(hidden_size, spec.num_experts, bias=spec.bias, dtype=dtype)
        self.experts = experts_cls(spec, hidden_size, dtype, expert_names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        weights, ids = select_experts(self.gate(x), self.spec.top_k, self.spec.scoring, self.spec.renormalize)
        return self.experts(x, weights, ids)
