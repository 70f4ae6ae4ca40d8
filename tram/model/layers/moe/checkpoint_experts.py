"""A quantized checkpoint's experts (GPTQ, AWQ, compressed-tensors MoE checkpoints quantize each
expert's gate/up/down like any Linear: `experts.3.gate_proj.qweight` ...).

The checkpoint loader (quant/checkpoints.py) unpacks each expert projection with its format, as for
a Linear, and hands it here with the slice this rank keeps; once every expert has arrived the layer
computes with the per-expert weights ("modules" ExpertWeights: the grouped path, on the quantized
linear kernels), gate and up of an expert side by side as its w13.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tram.model.layers.linear import linear
from tram.model.layers.parallel_linear import Shard


@dataclass(frozen=True)
class ExpertSlot:
    """Where one checkpoint expert projection goes: `local` expert index on this rank (None: another
    rank's), which stacked parameter and half, the whole projection's [out, in] and this rank's slice."""

    local: int | None
    param: str
    half: int | None
    full_shape: tuple[int, int]
    shard: Shard | None


class DenseExpert:
    """A float weight [N, K] where a format's layer could not be repacked (odd group sizes)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(x, self.weight.to(x.dtype), bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.weight.to(dtype)


class PairedExpert:
    """An expert's gate and up projections as one [2I, K] weight: their outputs side by side."""

    def __init__(self, gate: object, up: object) -> None:
        self.parts = (gate, up)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch.cat([part.apply(x, None) for part in self.parts], dim=-1)  # type: ignore[attr-defined]
        return out if bias is None else out + bias

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([part.dequantize(dtype) for part in self.parts])  # type: ignore[attr-defined]


def as_expert(weight: object) -> object:
    return DenseExpert(weight) if isinstance(weight, torch.Tensor) else weight
