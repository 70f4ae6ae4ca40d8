"""A quantized checkpoint's Linear unpacked to integers (by its format, formats/), and repacked into
the layouts of checkpoint_weight.py that Tram's kernels read.

Every 4-bit format stores w[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)], packed eight to an int32
(`unpack_int32` reads any of their layouts); unpacked, a layer is `Int4Parts`, which `int4_weight`
repacks. 8-bit formats unpack straight to an Int8Weight (checkpoint_weight.int8_weight).

Groups of unequal sizes (act-order groups that a checkpoint made so, a last group cut short where K
is no multiple of the group, a tensor-parallel rank's share of groups: checkpoint_shards.py) are
stored as runs of 32 columns (`int4_runs`). A group size that is no multiple of 32 (a per-channel
layer whose K is not) gets the dequantized float weight instead: same function, no compression.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tram.model.quant.checkpoint_weight import CheckpointInt4Weight
from tram.model.quant.weights import QuantizedWeight

_KERNEL_GROUP = 32  # the int4 kernel reads 32 k at a time; groups and K must be multiples of it

Parts = dict[str, torch.Tensor]  # one Linear's checkpoint tensors, by suffix (qweight, scales, ...)


@dataclass
class Int4Parts:
    """Unpacked 4-bit weight: q [N, K] uint8 0..15, scale [N, G] float32, zero [N, G] uint8 0..15 or
    None (8), group size, g_idx [K] int64 or None (k // group); made these dtypes on construction."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group: int
    g_idx: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # Formats hand over what they unpacked (int64 values, scales in the checkpoint's dtype).
        self.q = self.q.to(torch.uint8)
        self.scale = self.scale.float()
        self.zero = None if self.zero is None else self.zero.to(torch.uint8)
        self.g_idx = None if self.g_idx is None else self.g_idx.long()

    def groups_of_columns(self) -> torch.Tensor:
        """[K] the group of each input column."""
        if self.g_idx is not None:
            return self.g_idx
        return torch.arange(self.q.shape[1]) // self.group

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 (q - z) * s, the checkpoint's weight."""
        cols = self.groups_of_columns()
        zero = 8.0 if self.zero is None else self.zero.float()[:, cols]
        return (self.q.float() - zero) * self.scale[:, cols]


Unpacked = Int4Parts | QuantizedWeight  # int4 before repacking, or an int8 weight


def unpacked_shape(weight: Unpacked) -> tuple[int, int]:
    """(out, in) of an unpacked layer."""
    if isinstance(weight, Int4Parts):
        return tuple(weight.q.shape)
    return weight.out_features, weight.in_features


def unpack_int32(packed: torch.Tensor, dim: int, bits: int = 4, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Unsigned values packed 32 // bits to an int32 along `dim` (value i at bits * i, or column
    order[i] of its word's run) -> int64 tensor with that dimension 32 // bits times longer."""
    per_word = 32 // bits
    t = packed.to(torch.int32)
    if dim == 0:
        t = t.t()
    shifts = torch.arange(per_word, dtype=torch.int32) * bits
    values = (t.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [R, C, per_word]
    if order is not None:
        values = values[..., torch.tensor(order).argsort()]  # column j of the run = value i with order[i] == j
    values = values.reshape(t.shape[0], -1).long()
    return values.t() if dim == 0 else values


def int4_weight(p: Int4Parts) -> QuantizedWeight | torch.Tensor:
    """The kernel's weight for these parts, or their dequantized float weight [N, K] where the
    kernel cannot take the shape (see the module docstring)."""
    n, k = p.q.shape
    if p.group % _KERNEL_GROUP:
        return p.dequantize()
    if k % p.group:
        return int4_runs(p)  # a last group of fewer columns
    perm = None
    if p.g_idx is not None and not torch.equal(p.g_idx, torch.arange(k) // p.group):
        perm = torch.argsort(p.g_idx, stable=True)
        if not torch.equal(p.g_idx[perm], torch.arange(k) // p.group):
            return int4_runs(p)  # groups of unequal sizes
    q = p.q if perm is None else p.q.index_select(1, perm)
    groups = k // p.group
    scale, zero = p.scale[:, :groups], None if p.zero is None else p.zero[:, :groups]
    if zero is not None and bool((zero == 8).all()):
        zero = None  # symmetric after all: the plain int4 path
    return CheckpointInt4Weight(q, scale, p.group, zero, perm)


def int4_runs(p: Int4Parts) -> CheckpointInt4Weight:
    """Groups of any sizes as the kernel's groups of 32: each group's columns (sorted by group) in
    runs of 32, each run with its group's scale and zero point, the last run of a group padded with
    zero weights (q = the zero point, so (q - zero) * scale is exactly 0) that multiply column 0 of x.
    A group of c columns takes ceil(c / 32) runs; the scales cost 32 bits per 32 weights."""
    n, k = p.q.shape
    cols = p.groups_of_columns()
    order = torch.argsort(cols, stable=True)  # x's columns, grouped
    groups, counts = torch.unique_consecutive(cols[order], return_counts=True)
    runs = (counts + _KERNEL_GROUP - 1) // _KERNEL_GROUP
    first_run = torch.cumsum(runs, 0) - runs
    first_col = torch.cumsum(counts, 0) - counts
    within = torch.arange(k) - torch.repeat_interleave(first_col, counts)  # position inside its group
    dest = torch.repeat_interleave(first_run * _KERNEL_GROUP, counts) + within  # stored column of order[i]
    width = int(runs.sum()) * _KERNEL_GROUP
    run_group = torch.repeat_interleave(groups, runs)  # [width / 32] the checkpoint group of each run
    zero = None if p.zero is None else p.zero[:, run_group]
    pad = torch.full((n, width // _KERNEL_GROUP), 8, dtype=torch.uint8) if zero is None else zero
    q = pad.repeat_interleave(_KERNEL_GROUP, dim=1)  # [N, width]: every column a zero weight ...
    q[:, dest] = p.q[:, order].to(torch.uint8)  # ... but the real ones
    perm = torch.zeros(width, dtype=torch.int64)
    perm[dest] = order
    return CheckpointInt4Weight(q, p.scale[:, run_group], _KERNEL_GROUP, zero, perm, x_features=k)
