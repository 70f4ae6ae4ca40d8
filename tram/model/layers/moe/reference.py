"""The grouped PyTorch path of a mixture-of-experts layer: tokens sorted by expert, then each
active expert's two projections over its tokens, weighted and summed into float32.

It runs every weight form (experts.py) on the dense layers' kernels, where no fused kernel takes
the form (or the kernels are off: TRAM_CPU_KERNELS=0), and is what the fused kernels are tested
against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.layers.moe.experts import ExpertWeights


def gated_activation(h: torch.Tensor, activation: str, alpha: float, limit: float) -> torch.Tensor:
    """h [M, 2I] = [gate | up] -> [M, I]."""
    if activation == "silu":
        kernels = kernels_for(h) if h.dim() == 2 and h.dtype in (torch.float32, torch.bfloat16) else None
        if kernels is not None:
            return kernels.silu_and_mul(h.contiguous())
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    gate, up = h.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def grouped_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    activation: str,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """x [T, H], topk_ids [T, k] (local experts; -1: not on this rank), topk_weights [T, k] -> [T, H]."""
    num_tokens, k = topk_ids.shape
    experts = w13.num_experts
    flat = topk_ids.reshape(-1).long()
    valid = flat >= 0
    order = torch.argsort(torch.where(valid, flat, experts), stable=True)  # slots grouped by expert
    counts = torch.bincount(flat[valid], minlength=experts).tolist()
    weights = topk_weights.reshape(-1).float()
    out = torch.zeros(num_tokens, w2.out_features, dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if not count:
            continue
        slots = order[start : start + count]
        start += count
        rows = slots // k
        h = w13.expert(e)(x[rows], None if b13 is None else b13[e])  # [M, 2I]
        y = w2.expert(e)(gated_activation(h, activation, alpha, limit), None if b2 is None else b2[e])  # [M, H]
        out.index_add_(0, rows, y.float() * weights[slots, None])
    return out.to(x.dtype)
