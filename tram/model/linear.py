"""Linear layers whose few-row calls on CPU (a small decode batch) go to the C++ skinny kernel.

With a handful of rows a linear layer only streams its weight, and PyTorch's CPU gemv does that
at a fraction of the memory bandwidth (docs/benchmarks.md, "Skinny linear kernel"); the kernel in
csrc/skinny_linear.cpp streams it on every intra-op thread. Past a few rows the work becomes compute
and MKL/oneDNN's blocked GEMM wins, so larger batches keep F.linear. The row limits come from the
crossovers measured on the logits and MLP shapes of the 15M and 110M presets.
"""
from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from tram.model.cpu_kernels import kernels_for

# Most rows of x the kernel takes, per dtype; dtypes not listed always use F.linear.
SKINNY_MAX_ROWS: dict[torch.dtype, int] = {torch.float32: 8, torch.bfloat16: 4}


def _skinny_kernels(x: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    if x.dim() == 2 and x.shape[0] <= SKINNY_MAX_ROWS.get(x.dtype, 0) and weight.dtype == x.dtype:
        return kernels_for(x)
    return None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, or the skinny kernel for a 2-D CPU input of at most SKINNY_MAX_ROWS rows (inference only)."""
    kernels = _skinny_kernels(x, weight)
    if kernels is not None:
        return kernels.skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_n(x: torch.Tensor, layers: Sequence[nn.Linear]) -> list[torch.Tensor]:
    """[layer(x) for layer in layers], in one kernel call when x is skinny (q/k/v, gate/up): one
    conversion of x and one parallel region instead of one per layer; each result is unchanged."""
    kernels = _skinny_kernels(x, layers[0].weight)
    if kernels is not None and all(layer.weight.dtype == x.dtype for layer in layers):
        return kernels.skinny_linear_n(x, [layer.weight for layer in layers], [layer.bias for layer in layers])
    return [linear(x, layer.weight, layer.bias) for layer in layers]


class Linear(nn.Linear):
    """nn.Linear (same parameters and names, so checkpoints load unchanged) routed through `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
