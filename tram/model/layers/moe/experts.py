"""The stacked weights of a layer's experts in one of the forms Tram keeps weights in.

One projection (gate/up stacked as w13, or down as w2) of the E experts this rank holds, [E, N, ...]:
  * "float": data [E, N, K] in the model's dtype;
  * "int8":  data [E, N, K] int8, scale [E, N] (quant/weights.py Int8Weight's layout per expert);
  * "int4":  data [E, N, K / 2] uint8, scale [E, N, K / group] (Int4Weight's layout per expert), and
    where a quantized checkpoint has them, zero [E, N, K / group] uint8 zero points (CheckpointInt4Weight's);
  * "gguf":  data [E, N, row_bytes] uint8 blocks of one ggml type (gguf/weight.py GGUFWeight's);
  * "modules": one weight object per expert (a quantized checkpoint's experts in a layout no fused
    kernel takes, such as act-order: checkpoint_experts.py), `data` empty; only the grouped path runs them.
Stacked, so that the fused kernels (csrc/fused_moe.cpp, triton_moe.py) take every expert in one
call; `expert(e)` gives one expert's weight as the linear layers' own classes, which the grouped
PyTorch path (reference.py) multiplies by, on the same kernels as a dense layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tram.model.layers.linear import linear
from tram.model.quant.checkpoint_weight import CheckpointInt4Weight
from tram.model.quant.weights import Int4Weight, Int8Weight, QuantizedWeight, int4_group_size

ExpertLinear = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
KINDS = ("float", "int8", "int4", "gguf", "modules")


def _view(cls: type[QuantizedWeight], **fields: object) -> QuantizedWeight:
    """A QuantizedWeight of `cls` over existing tensors (no quantization run)."""
    weight = cls.__new__(cls)
    vars(weight).update(fields)
    return weight


@dataclass
class ExpertWeights:
    kind: str
    data: torch.Tensor
    out_features: int
    in_features: int
    scale: torch.Tensor | None = None
    zero: torch.Tensor | None = None  # int4: a checkpoint's zero points (None: 8, symmetric)
    group: int = 0
    ggml_type: int = 0
    int8_activations: bool = False  # gguf: x quantized to int8 (`--gguf-activations int8`; per 256 for K-quants)
    _views: list[QuantizedWeight] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"expert weight kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @classmethod
    def of_modules(cls, experts: list, out_features: int, in_features: int) -> ExpertWeights:
        """Per-expert weight objects, each with apply(x, bias) and dequantize(dtype)."""
        return cls("modules", torch.empty(len(experts), 0), out_features, in_features, _views=list(experts))

    @property
    def num_experts(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        if self.kind == "modules":
            return sum(getattr(v, "nbytes", 0) for v in self._views)
        extra = sum(t.numel() * t.element_size() for t in (self.scale, self.zero) if t is not None)
        return self.data.numel() * self.data.element_size() + extra

    @property
    def file_type(self) -> int:
        """gguf: the ggml type of the file's blocks (ggml_type unless they were repacked at load)."""
        from tram.model.gguf.weight import REPACKED  # the GGUF loader's; imported where GGUF experts exist

        return REPACKED.get(self.ggml_type, self.ggml_type)

    def param(self) -> int:
        """The fused kernel's per-form argument: the int4 group or the ggml type."""
        return self.group if self.kind == "int4" else self.ggml_type if self.kind == "gguf" else 0

    def expert(self, e: int) -> ExpertLinear:
        """Expert e's projection: (x [M, K], bias [N] or None) -> [M, N]."""
        if self.kind == "float":
            weight = self.data[e]
            return lambda x, bias: linear(x, weight, bias)
        return self.views()[e].apply

    def views(self) -> list[QuantizedWeight]:
        """One weight object per expert (built on first use; "modules" weights are given them)."""
        if not self._views:
            self._views = [self._expert_view(i) for i in range(self.num_experts)]
        return self._views

    def _expert_view(self, e: int) -> QuantizedWeight:
        n, k = self.out_features, self.in_features
        if self.kind == "int8":
            return _view(Int8Weight, qweight=self.data[e], scale=self.scale[e], out_features=n, in_features=k)
        if self.kind == "int4" and self.zero is not None:
            return _view(
                CheckpointInt4Weight,
                qweight=self.data[e],
                scale=self.scale[e],
                zero=self.zero[e],
                group=self.group,
                out_features=n,
                in_features=k,
                x_features=k,
            )
        if self.kind == "int4":
            return _view(
                Int4Weight, qweight=self.data[e], scale=self.scale[e], group=self.group, out_features=n, in_features=k
            )
        from tram.model.gguf.weight import GGUFWeight  # the GGUF loader's; imported where GGUF experts exist

        return GGUFWeight(self.data[e], self.ggml_type, k, self.int8_activations)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[E, N, K] float weights (tests, and paths without a kernel for this kind)."""
        if self.kind == "float":
            return self.data.to(dtype)
        return torch.stack([view.dequantize(dtype) for view in self.views()])


def quantize_experts(weights: ExpertWeights, method: str) -> ExpertWeights:
    """Float expert weights in int8 (per output channel) or int4 (per group of input channels; int8
    where no group size divides K), quantized expert by expert as a dense layer's would be."""
    assert weights.kind == "float"
    n, k = weights.out_features, weights.in_features
    group = int4_group_size(k) if method == "int4" else None
    if group is not None:
        parts4 = [Int4Weight(w, group) for w in weights.data]
        data = torch.stack([p.qweight for p in parts4])
        return ExpertWeights("int4", data, n, k, torch.stack([p.scale for p in parts4]), group=group)
    parts8 = [Int8Weight(w) for w in weights.data]
    return ExpertWeights("int8", torch.stack([p.qweight for p in parts8]), n, k, torch.stack([p.scale for p in parts8]))
