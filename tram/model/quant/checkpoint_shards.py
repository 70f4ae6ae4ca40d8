"""A quantized checkpoint's Linears under tensor parallelism: each rank unpacks the whole layer's
tensors (its format's `unpack`, formats/), keeps its `Shard` (parallel_linear.py; the format's
`shard`, which defaults to `shard_weight` here) and repacks only that, so it holds its slice of the
layer in the same int4 / int8 form as one rank holds all of it.

  * Column-parallel (q/k/v, gate/up): output rows [start, start + size) of the values, scales and
    zero points. Groups run along the input, so every rank keeps every group, whole.
  * Row-parallel (o_proj, down_proj): input columns [start, start + size), with the scales and zero
    points of every group they touch. Where a rank's columns are whole groups (its share of K a
    multiple of the group size, no act-order) the layer keeps its layout; otherwise (act-order
    groups, which scatter each group over the whole of K, or a group that the rank boundary cuts)
    the rank holds parts of groups of unequal sizes, which unpacked.int4_runs stores as runs of 32
    columns. vLLM's GPTQ kernels look each column's group up in g_idx instead.
    Per-channel scales (one group of K) cover any columns: the slice's group is its own width.

int8 (compressed-tensors W8A16) is per output channel: rows and scales for column-parallel, columns
(all scales) for row-parallel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tram.model.quant.checkpoint_weight import int8_weight
from tram.model.quant.unpacked import Int4Parts, Unpacked

if TYPE_CHECKING:  # parallel_linear imports linear, which imports this package: no import cycle at run time
    from tram.model.layers.parallel_linear import Shard


def layer_shard(module: nn.Module) -> Shard | None:
    """The module's slice of its layer; None where it holds all of it (one rank, or no parallel linear)."""
    shard: Shard | None = getattr(module, "shard", None)
    return None if shard is None or shard.whole else shard


def full_shape(module: nn.Module) -> tuple[int, int]:
    """(out, in) of the whole layer, of which the module may hold a shard."""
    shard: Shard | None = getattr(module, "shard", None)
    if shard is None:
        return module.out_features, module.in_features
    return shard.full_shape(module.out_features, module.in_features)


def shard_weight(weight: Unpacked, shard: Shard) -> Unpacked:
    """This rank's slice of a whole layer's unpacked int4 parts or int8 weight."""
    if isinstance(weight, Int4Parts):
        return _shard_int4(weight, shard)
    rows = shard.dim == 0
    q = weight.qweight.narrow(shard.dim, shard.start, shard.size)  # [N, K] int8, per-channel scales
    return int8_weight(q, weight.scale.narrow(0, shard.start, shard.size) if rows else weight.scale)


def _shard_int4(p: Int4Parts, shard: Shard) -> Int4Parts:
    end = shard.start + shard.size
    if shard.dim == 0:  # output rows: every group, whole
        zero = None if p.zero is None else p.zero[shard.start : end]
        return Int4Parts(p.q[shard.start : end], p.scale[shard.start : end], zero, p.group, p.g_idx)
    q = p.q[:, shard.start : end]  # [N, K / tp]
    if p.group >= p.q.shape[1]:  # per channel: the rank's columns are its one group
        return Int4Parts(q, p.scale, p.zero, shard.size)
    # The groups this rank's columns touch, renumbered 0.. in order, with their scales and zero points;
    # int4_weight keeps the layout where they are whole, runs of 32 where they are not.
    groups, g_idx = torch.unique(p.groups_of_columns()[shard.start : end], return_inverse=True)
    zero = None if p.zero is None else p.zero[:, groups]
    return Int4Parts(q, p.scale[:, groups], zero, p.group, g_idx)
