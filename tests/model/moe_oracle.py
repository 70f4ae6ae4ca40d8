"""The mixture-of-experts oracle the fused kernels' tests (C++ and Triton) hold them to: per expert,
gather its tokens, two float32 matmuls, the activation, a weighted index_add; and the random bf16
experts the kernel's bf16 paths are tested on."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tram.model.layers.moe.experts import ExpertWeights


def reference_moe(x, ids, weights, w13, w2, b13, b2, activation, alpha=1.702, limit=7.0) -> torch.Tensor:
    """The spec's oracle; w13 [E, 2I, H] and w2 [E, H, I] are the (dequantized) float weights."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    xf = x.float()
    for e in range(w13.shape[0]):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        h = xf[t] @ w13[e].float().T + (0 if b13 is None else b13[e].float())
        gate, up = h.chunk(2, dim=-1)
        if activation == "silu":
            act = F.silu(gate) * up
        else:
            g, u = gate.clamp(max=limit), up.clamp(-limit, limit)
            act = (u + 1) * g * torch.sigmoid(alpha * g)
        y = act @ w2[e].float().T + (0 if b2 is None else b2[e].float())
        out.index_add_(0, t, y * weights[t, j, None])
    return out.to(x.dtype)


def bf16_experts(E: int, H: int, I: int, seed: int, bias: bool) -> tuple[torch.Tensor, ...]:
    """(w13 [E, 2I, H], w2 [E, H, I], b13 [E, 2I] or None, b2 [E, H] or None), bfloat16, unit-scale outputs."""
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) / I**0.5).bfloat16()
    b13 = (torch.randn(E, 2 * I, generator=g) * 0.1).bfloat16() if bias else None
    b2 = (torch.randn(E, H, generator=g) * 0.1).bfloat16() if bias else None
    return w13, w2, b13, b2


def stacked(w: torch.Tensor) -> ExpertWeights:
    """Float experts [E, N, K] in the layer's stacked form."""
    return ExpertWeights("float", w.contiguous(), w.shape[1], w.shape[2])
