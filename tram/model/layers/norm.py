"""RMSNorm in the roundings Hugging Face uses: Llama's (weight times the normalised row cast back),
Gemma's (1 + weight, multiplied in float32 before the cast back) and OLMo 2's (weight multiplied in
float32 before the cast back), and OLMo 2's norm over a row that tensor-parallel ranks split."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tram.distributed import tp_all_reduce
from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.layers.parallel_linear import slice_loader
from tram.model.weight_utils import set_weight_loader


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


class FloatScale:
    """A float32 tensor derived from a parameter, made again only when the parameter changes (a load
    writes it in place, which bumps its version): the norms' float32 weight, made once, not per call."""

    def __init__(self, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.make = make
        self.key: tuple[int, int] | None = None
        self.value: torch.Tensor | None = None

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        key = (weight.data_ptr(), weight._version)
        if key != self.key or self.value is None:
            self.value, self.key = self.make(weight.detach()).contiguous(), key
        return self.value


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the checkpoint stores w and the row is scaled by (1 + w), all in float32.

    Unlike Llama's, the normalised row is not rounded to the activation dtype before the weight
    multiplies it: on CPU the C++ kernel takes 1 + w as a float32 weight for that rounding.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
        self.eps = eps
        self.scale = FloatScale(lambda w: 1.0 + w.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., hidden]
        kernels = kernels_for(x)
        if kernels is not None:  # one call instead of ten ops: six norms a layer in Gemma 3
            return kernels.rms_norm(x.reshape(-1, x.shape[-1]), self.scale(self.weight), self.eps).view(x.shape)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def norm_add(
        self, x: torch.Tensor, residual: torch.Tensor, next_norm: GemmaRMSNorm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(s, next_norm(s)) with s = residual + self(x): Gemma's sandwich, one C++ call on CPU
        (the same roundings as the separate norms and add). [T, hidden] each."""
        kernels = kernels_for(x)
        if kernels is not None and x.dim() == 2 and (next_norm is None or next_norm.eps == self.eps):
            nxt = None if next_norm is None else next_norm.scale(next_norm.weight)
            s, normed = kernels.rms_norm_add(x, residual, self.scale(self.weight), self.eps, nxt)
            return s, None if next_norm is None else normed
        s = residual + self(x)
        return s, None if next_norm is None else next_norm(s)


class Float32WeightRMSNorm(RMSNorm):
    """OLMo 2's RMSNorm: the weight multiplies the normalised row in float32, rounded once after.

    In float32 that is Llama's rounding; in 16-bit dtypes the C++ kernel takes the weight as float32.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__(hidden_size, eps, dtype)
        self.scale = FloatScale(lambda w: w.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.rms_norm(x, self.scale(self.weight), self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + x  # not the fused kernel: it rounds as Llama's norm does
        return self.forward(h), h


class ShardedRowRMSNorm(nn.Module):
    """OLMo 2's RMSNorm (weight in float32) over a row of `full` features of which this tensor-parallel
    rank holds [start, start + size), as its weight: q and k normed over all heads, not per head.

    The mean of squares needs the whole row, so the ranks all-reduce their sums of squares (one
    [T, 1] float32 tensor); `replicas` ranks hold each feature (KV heads replicated when the ranks
    outnumber them), so the sum is divided by it. With the whole row on the rank, nothing is sent.
    """

    def __init__(self, full: int, start: int, size: int, eps: float, dtype: torch.dtype, replicas: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))
        self.sharded = size != full
        if self.sharded:
            set_weight_loader(self.weight, slice_loader(0, start, size, full))
        self.divisor = float(full * replicas)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, size] -> [T, size]
        x32 = x.float()
        if self.sharded:
            variance = tp_all_reduce(x32.pow(2).sum(-1, keepdim=True)) / self.divisor  # [T, 1]
        else:
            variance = x32.pow(2).mean(-1, keepdim=True)  # [T, 1]: transformers' own reduction
        return (self.weight.float() * (x32 * torch.rsqrt(variance + self.eps))).to(x.dtype)
