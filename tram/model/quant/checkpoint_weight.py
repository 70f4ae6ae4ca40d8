"""Weights read from a quantized checkpoint (GPTQ, AWQ, compressed-tensors; formats/), in
the layouts of weights.py so that csrc/quant_linear.cpp runs them:

  * CheckpointInt4Weight: Int4Weight's nibbles and group scales, plus a zero point per group where the
    checkpoint is asymmetric, w = (q - zero[n, g]) * scale[n, g], and the input columns in the
    checkpoint's act-order where it has one (GPTQ desc_act, compressed-tensors actorder "group").
  * int8_weight: an Int8Weight (per-channel symmetric) from a checkpoint's int8 values and scales.

The zero point is an integer, not a float offset m = -zero * scale: (q - zero) is exact in int8, so
each widened weight is exactly (q - zero) * scale, the checkpoint's dequantized value, as the
symmetric path's (q - 8) * scale is; a fused q * scale + m would round differently.
"""

from __future__ import annotations

import torch

from tram.model.quant.weights import Int4Weight, Int8Weight, _kernels, pack_int4, reference_linear, unpack_int4


def int8_weight(qweight: torch.Tensor, scale: torch.Tensor) -> Int8Weight:
    """An already quantized Int8Weight: qweight [N, K] int8, scale [N] (or [N, 1])."""
    weight = Int8Weight.__new__(Int8Weight)
    weight.out_features, weight.in_features = qweight.shape
    weight.qweight = qweight.to(torch.int8).contiguous()
    weight.scale = scale.float().reshape(-1).contiguous()
    return weight


class CheckpointInt4Weight(Int4Weight):
    """int4 as a checkpoint stored it. `zero` [N, K / g] uint8 (0..15): each group's zero point (None:
    8, symmetric). `perm` [K] int64: for each stored input column, the column of x it multiplies.
    Act-order checkpoints assign input columns to groups by salience; sorted by group, every group is
    contiguous, as the kernel needs, and x is permuted the same way (index_select) before it, so the
    product is that of the original weight. Groups of unequal sizes are stored as runs of 32 columns
    (unpacked.int4_runs), the last of each padded with zero weights whose `perm` entry is
    any column of x: then in_features (the stored width) exceeds `x_features`, x's width."""

    perm: torch.Tensor | None = None

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        group: int,
        zero: torch.Tensor | None = None,
        perm: torch.Tensor | None = None,
        x_features: int | None = None,
    ) -> None:
        # q [N, K] values 0..15 in stored column order; scale (and zero) [N, K / group]
        self.out_features, self.in_features = q.shape
        self.x_features = self.in_features if x_features is None else x_features
        self.group = group
        self.qweight = pack_int4(q)  # [N, K / 2]
        self.scale = scale.float().contiguous()
        self.zero = None if zero is None else zero.to(torch.uint8).contiguous()
        self.perm = None if perm is None else perm.to(torch.int64).contiguous()

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """QuantizedWeight's kernels (zero points included) on x's columns in stored order."""
        if self.perm is None:
            return super().apply(x, bias)
        if not (x.is_cuda or self.use_triton) and _kernels(x) is None:
            return reference_linear(x, self, bias)  # dequantize() is in x's column order
        stored = x.reshape(-1, x.shape[-1]).index_select(1, self.perm)
        return super().apply(stored, bias).view(*x.shape[:-1], self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.zero is None:
            w = super().dequantize(torch.float32)
        else:
            q = unpack_int4(self.qweight).float().view(self.out_features, -1, self.group)  # [N, K / g, g]
            w = ((q - self.zero.float()[..., None]) * self.scale[..., None]).view(self.out_features, -1)
        if self.perm is not None:  # back to x's column order; padding columns add exact zeros
            w = w.new_zeros(self.out_features, self.x_features).index_add_(1, self.perm, w)
        return w.to(dtype)

    @property
    def nbytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for t in (self.zero, self.perm) if t is not None)
        return super().nbytes + extra
