"""A quantized checkpoint's experts (GPTQ, AWQ, compressed-tensors MoE checkpoints quantize each
expert's gate/up/down like any Linear: `experts.3.gate_proj.qweight` ...).

The checkpoint loader (quant/checkpoints.py) unpacks each expert projection with its format, as for
a Linear, and hands it here with the slice this rank keeps; once every expert has arrived the layer
stacks them in the form the fused kernels take where each is int8 per channel or int4 of one group
size without act-order (zero points kept: AWQ, asymmetric GPTQ), gate and up rows of an expert one
after the other as its w13. Other experts (act-order, mixed formats) stay per-expert weights
("modules" ExpertWeights: the grouped path, on the quantized linear kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tram.model.layers.linear import linear
from tram.model.layers.moe.experts import ExpertWeights
from tram.model.layers.parallel_linear import Shard
from tram.model.quant.weights import Int4Weight, Int8Weight


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


def stacked_experts(parts: list[list[object]], out_features: int, in_features: int) -> ExpertWeights:
    """Each local expert's projection from its parts (gate and up, or down alone): stacked as int8 or
    int4 ExpertWeights where every part allows it, else per-expert weights for the grouped path."""
    flat = [w for expert in parts for w in expert]

    def stack(field: str) -> torch.Tensor:
        return torch.stack([torch.cat([getattr(w, field) for w in expert]) for expert in parts])

    if all(type(w) is Int8Weight for w in flat):
        return ExpertWeights("int8", stack("qweight"), out_features, in_features, stack("scale"))
    if _int4_stackable(flat):
        zero = None
        if any(getattr(w, "zero", None) is not None for w in flat):
            zero = torch.stack([torch.cat([_zero_points(w) for w in expert]) for expert in parts])
        group = flat[0].group  # type: ignore[attr-defined]
        return ExpertWeights("int4", stack("qweight"), out_features, in_features, stack("scale"), zero, group)
    experts = [PairedExpert(*expert) if len(expert) == 2 else expert[0] for expert in parts]
    return ExpertWeights.of_modules(experts, out_features, in_features)


def _int4_stackable(weights: list[object]) -> bool:
    """int4 of one group size in stored column order (no act-order permutation of x)."""
    first = weights[0]
    return isinstance(first, Int4Weight) and all(
        isinstance(w, Int4Weight)
        and w.group == first.group
        and w.in_features == first.in_features
        and getattr(w, "perm", None) is None
        and w.scale.dtype == torch.float32
        for w in weights
    )


def _zero_points(weight: Int4Weight) -> torch.Tensor:
    zero = getattr(weight, "zero", None)
    return zero if zero is not None else torch.full_like(weight.scale, 8, dtype=torch.uint8)
