"""Megatron-style sharded linears: each rank holds a slice of a checkpoint weight, cut while loading.

  * ColumnParallelLinear: output rows [start, start + size) of the full [out, in] weight (q/k/v,
    gate/up). Its output is this rank's heads or channels; nothing is communicated.
  * RowParallelLinear: input columns [start, start + size) (o_proj, down_proj). Each rank's product
    is a partial sum; one all-reduce adds them, and the bias is added once, after it.

With one rank the slices are the whole tensors and the layers are plain `Linear`s. The loaders check
the checkpoint tensor's full shape before slicing, so a wrong checkpoint fails as it does unsharded.
Each layer keeps its `shard`, so that loaders other than the float weight's (a quantized checkpoint's
packed tensors, quant/checkpoint_shards.py) cut the same slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tram.distributed import get_tp, tp_all_reduce
from tram.model.layers.linear import Linear
from tram.model.weight_utils import WeightLoader, WeightShapeError, set_weight_loader


def slice_loader(dim: int, start: int, size: int, full: int) -> WeightLoader:
    """A weight loader copying loaded[start:start + size] along `dim` of a tensor `full` long there
    into the parameter's first `size` entries (later ones, vocab padding, are zeroed).

    It also takes a safetensors slice (the loading loop hands one to loaders marked `reads_slices`),
    so a rank reads only its own part of the file."""

    def load(param: nn.Parameter, loaded: Any) -> None:
        shape = list(loaded.get_shape()) if hasattr(loaded, "get_shape") else list(loaded.shape)
        expected = list(param.shape)
        expected[dim] = full
        if shape != expected:
            raise WeightShapeError(tuple(shape), tuple(expected))
        length = min(size, full - start)
        if hasattr(loaded, "get_shape"):
            index = [slice(None)] * len(shape)
            index[dim] = slice(start, start + length)
            piece = loaded[tuple(index)]
        else:
            piece = loaded.narrow(dim, start, length)
        target = param.narrow(dim, 0, piece.shape[dim])
        target.copy_(piece)
        if piece.shape[dim] < param.shape[dim]:
            param.narrow(dim, piece.shape[dim], param.shape[dim] - piece.shape[dim]).zero_()

    load.reads_slices = size != full  # type: ignore[attr-defined]
    return load


@dataclass(frozen=True)
class Shard:
    """The part of a full [out, in] weight that a rank's linear holds: [start, start + size) of the
    `full` entries along `dim` (0: output rows, 1: input columns)."""

    dim: int
    start: int
    size: int
    full: int

    @property
    def whole(self) -> bool:
        return self.size == self.full

    def full_shape(self, out_features: int, in_features: int) -> tuple[int, int]:
        """The whole layer's (out, in), given this rank's."""
        return (self.full, in_features) if self.dim == 0 else (out_features, self.full)

    def loader(self) -> WeightLoader:
        return slice_loader(self.dim, self.start, self.size, self.full)


class ColumnParallelLinear(Linear):
    """Rows [start, start + size) of a [full_out, in_features] linear."""

    def __init__(
        self, in_features: int, full_out: int, start: int, size: int, *, bias: bool, dtype: torch.dtype
    ) -> None:
        super().__init__(in_features, size, bias=bias, dtype=dtype)
        self.shard = Shard(0, start, size, full_out)
        set_weight_loader(self.weight, self.shard.loader())
        if self.bias is not None:
            set_weight_loader(self.bias, self.shard.loader())


class RowParallelLinear(Linear):
    """Columns [start, start + size) of a [out_features, full_in] linear; outputs summed over ranks."""

    def __init__(
        self, full_in: int, out_features: int, start: int, size: int, *, bias: bool, dtype: torch.dtype
    ) -> None:
        super().__init__(size, out_features, bias=bias, dtype=dtype)
        self.tp_size = get_tp().size
        self.shard = Shard(1, start, size, full_in)
        set_weight_loader(self.weight, self.shard.loader())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in / tp] -> [T, out]
        if self.tp_size == 1:
            return super().forward(x)
        y = tp_all_reduce(self.matmul(x, None))
        return y if self.bias is None else y + self.bias
