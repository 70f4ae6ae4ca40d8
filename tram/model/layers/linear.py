"""Linear layers on CPU: the C++ skinny kernel for a row or two, oneDNN on a packed weight past that.

With a handful of rows a linear layer only streams its weight, and PyTorch's CPU gemv does that
at a fraction of the memory bandwidth (docs/benchmarks.md, "Skinny linear kernel"); the kernel in
csrc/skinny_linear.cpp streams it on every intra-op thread. Past a few rows the work becomes compute:
a layer whose weight was packed for oneDNN at load (cpu_packed.py) runs its inner product, which
beats the skinny kernel from 2-3 rows on; an unpacked one keeps the skinny kernel a little longer,
then MKL through F.linear. The row limits come from the crossovers measured on the logits and MLP
shapes of the 15M and 110M presets.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.layers.cpu_packed import DecodePairs, PackFn, PairPacked, packed_linear
from tram.model.quant.weights import QuantizedWeight

# Most rows of x the skinny kernel takes, per dtype; dtypes not listed never use it. Without a packed
# weight the alternative is MKL (slower on few rows), with one it is oneDNN (faster from 3-4 rows).
SKINNY_MAX_ROWS: dict[torch.dtype, int] = {torch.float32: 8, torch.bfloat16: 4}
# float32 at 3 rows: on cold weights (each layer's its own, as a decode step reads them) the skinny
# kernel ran in 0.67-0.96 of oneDNN's time on hidden sizes 288-2048, and lost from 4 rows at 2048.
SKINNY_MAX_ROWS_BESIDE_PACKED: dict[torch.dtype, int] = {torch.float32: 3, torch.bfloat16: 2}
# A oneDNN call costs ~13-15 us however small its weight; the skinny kernel reads a weight this small
# in a few us at any of its rows (docs/benchmarks.md), so beside a packed copy it keeps all of them.
SMALL_WEIGHT_ELEMENTS = 1 << 17
# ... up to this many rows in float32 (at 16 it still ran in 0.3-1.0 of oneDNN's time; verifying 8+
# drafts a row takes that many; benchmarks/cpu_small_weights.py --rows 8,9,12,16).
SKINNY_MAX_ROWS_SMALL: dict[torch.dtype, int] = {torch.float32: 16}


def skinny_rows_beside_packed(dtype: torch.dtype, numel: int) -> int:
    """Most rows the skinny kernel takes from a weight of `numel` elements that also has a packed copy."""
    if numel <= SMALL_WEIGHT_ELEMENTS:
        return SKINNY_MAX_ROWS_SMALL.get(dtype, SKINNY_MAX_ROWS.get(dtype, 0))
    return SKINNY_MAX_ROWS_BESIDE_PACKED.get(dtype, 0)


def _skinny_kernels(
    x: torch.Tensor, weight: torch.Tensor, packed: bool = False, numel: int | None = None
) -> ModuleType | None:
    limit = skinny_rows_beside_packed(x.dtype, numel or weight.numel()) if packed else SKINNY_MAX_ROWS.get(x.dtype, 0)
    if x.dim() == 2 and x.shape[0] <= limit and weight.dtype == x.dtype:
        return kernels_for(x)
    return None


def _packed_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x may run on a packed copy of `weight` at all: 2-D, the weight's dtype, no autograd."""
    return x.dim() == 2 and x.dtype == weight.dtype and not torch.is_grad_enabled()


def takes_packed(x: torch.Tensor, weight: torch.Tensor, numel: int | None = None) -> bool:
    """Whether a layer with a packed copy of `weight` (numel: of the stacked weight packed in its place)
    runs x through oneDNN (not the skinny kernel)."""
    return _packed_usable(x, weight) and x.shape[0] > skinny_rows_beside_packed(x.dtype, numel or weight.numel())


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed_weight: torch.Tensor | PairPacked | DecodePairs | None = None,
) -> torch.Tensor:
    """x @ weight.T + bias: the skinny kernel for a 2-D CPU input of a few rows, oneDNN when the
    weight has a packed copy (cpu_packed.py), else F.linear; a weight packed in pairs of k takes
    pair_linear at every row count. Inference only past F.linear."""
    usable_packed = packed_weight is not None and _packed_usable(x, weight)
    if usable_packed and isinstance(packed_weight, PairPacked):
        return packed_linear(x, packed_weight, bias)
    kernels = _skinny_kernels(x, weight, usable_packed)
    if kernels is not None:
        return kernels.skinny_linear(x, weight, bias)
    if usable_packed:
        return packed_linear(x, packed_weight, bias)
    return F.linear(x, weight, bias)


def linear_n(x: torch.Tensor, layers: Sequence[Linear]) -> list[torch.Tensor]:
    """[layer(x) for layer in layers], in one kernel call when x is skinny (q/k/v, gate/up): one
    conversion of x and one parallel region instead of one per layer; each result is unchanged."""
    quants = [layer.quant for layer in layers]
    if any(q is not None for q in quants):
        if all(q is not None for q in quants):
            first, *others = quants
            out = first.apply_n(x, others, [layer.bias for layer in layers])  # type: ignore[union-attr]
            if out is not None:
                return out
        return [layer(x) for layer in layers]
    packed = all(layer.packed_weight is not None for layer in layers)
    kernels = _skinny_kernels(x, layers[0].weight, packed, sum(layer.weight.numel() for layer in layers))
    if kernels is not None and all(layer.weight.dtype == x.dtype for layer in layers):
        return kernels.skinny_linear_n(x, [layer.weight for layer in layers], [layer.bias for layer in layers])
    return [layer(x) for layer in layers]


def pack_stacked(
    layers: Sequence[Linear], pack: PackFn
) -> tuple[torch.Tensor | DecodePairs | None, torch.Tensor | None]:
    """The layers' weights stacked [sum N, K] and packed as one (gate/up, q/k/v: one GEMM runs them
    all), and their biases stacked; (None, None) where a layer is quantized or `pack` refuses."""
    if any(layer.quant is not None for layer in layers):
        return None, None
    packed = pack(torch.cat([layer.weight for layer in layers]))
    if packed is None or layers[0].bias is None:
        return packed, None
    return packed, torch.cat([layer.bias for layer in layers])


class Linear(nn.Linear):
    """nn.Linear (same parameters and names, so checkpoints load unchanged) routed through `linear`.

    `packed_weight` is a oneDNN-packed copy of `weight` that cpu_packed.pack_cpu_linears sets after
    loading (CPU only); it is no parameter or buffer, so state_dict and loading never see it.
    `quant` is the weight in fewer bits where the model was quantized after loading (quant/apply.py);
    `weight` is then empty."""

    packed_weight: torch.Tensor | DecodePairs | None = None
    quant: QuantizedWeight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W.T + bias, on whichever form of W this layer holds."""
        if self.quant is not None:
            return self.quant.apply(x, bias)
        return linear(x, self.weight, bias, self.packed_weight)
