"""RMSNorm in the two roundings Hugging Face uses: Llama's (weight times the normalised row cast back)
and Gemma's (1 + weight, multiplied in float32 before the cast back)."""

from __future__ import annotations

import torch
from torch import nn

from tram.model.kernels.cpu_kernels import kernels_for


class RMSNorm(nn.Module):
    """Root-mean-square norm as Hugging Face computes it: statistics in float32, then cast back."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        kernels = kernels_for(x)
        if kernels is not None:  # one C++ call instead of seven ops (csrc/rms_norm.cpp)
            return kernels.rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the residual add fused into the norm on CPU."""
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.add_rms_norm(x, residual, self.weight, self.eps)
        h = residual + x
        return self.forward(h), h


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the checkpoint stores w and the row is scaled by (1 + w), all in float32.

    Unlike Llama's, the normalised row is not rounded to the activation dtype before the weight
    multiplies it, so the C++ kernel (Llama's roundings) does not apply; these are PyTorch ops.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., hidden]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)
