"""The router: which k experts each token goes to, and with what weight.

Its linear is replicated on every rank (E outputs are few) and computed in the model's dtype, as
transformers does; the scores are float32 from the logits on.
"""

from __future__ import annotations

import torch

from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.layers.linear import Linear


class Router(Linear):
    """gate.weight [E, hidden] (and gpt-oss's bias): hidden [T, hidden] -> logits [T, E]."""


def select_experts(
    logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k] int32) from router logits [T, E]; see spec.SCORING.
    On CPU one kernel call (csrc/moe_route.cpp: the same choice, weights within float rounding)."""
    kernels = kernels_for(logits)
    if kernels is not None and logits.dim() == 2 and logits.shape[0] > 0:
        return kernels.moe_route(logits, top_k, scoring == "softmax_topk", renormalize)
    logits = logits.float()
    if scoring == "topk_softmax":
        values, ids = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(values, dim=-1), ids.to(torch.int32)
    probs = torch.softmax(logits, dim=-1)
    values, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        values = values / values.sum(dim=-1, keepdim=True)
    return values, ids.to(torch.int32)
