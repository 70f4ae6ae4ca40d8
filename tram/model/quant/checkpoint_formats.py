"""One quantized Linear's checkpoint tensors -> its Tram weight: the GPTQ, AWQ and compressed-tensors
layouts, unpacked to integers and repacked into checkpoint_weight.py's.

Every format stores w[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)] with 4-bit q and z packed eight to
an int32 (4-bit value i of a word at bits 4i), differing in which dimension is packed and how:

  * GPTQ (AutoGPTQ / GPTQModel): qweight [K / 8, N] packed along K; qzeros [G, N / 8] along N;
    scales [G, N]; g_idx [K], the group of each input column (act-order when not k // group). The
    classic format ("gptq", v1) stores z - 1 in qzeros; "gptq_v2" stores z.
  * AWQ GEMM: qweight [K, N / 8] and qzeros [G, N / 8] packed along N in the order 0, 2, 4, 6, 1, 3,
    5, 7 (value i of a word is column AWQ_ORDER[i] of its eight); scales [G, N].
  * compressed-tensors pack-quantized: weight_packed [N, ceil(K / 8)] along K of q + 8 (q signed);
    weight_scale [N, G]; weight_shape [N, K]; weight_zero_point (asymmetric) [ceil(N / 8), G] along N
    of z + 8; weight_g_idx [K] with actorder "group". 8-bit: four per int32 of q + 128.
  * compressed-tensors int-quantized: weight [N, K] int8, weight_scale [N, 1].

Groups of unequal sizes (act-order groups that a checkpoint made so, a last group cut short where K
is no multiple of the group, a tensor-parallel rank's share of groups: checkpoint_shards.py) are
stored as runs of 32 columns (`int4_runs`). A group size that is no multiple of 32 (a per-channel
layer whose K is not) gets the dequantized float weight instead: same function, no compression.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tram.model.quant.checkpoint_weight import CheckpointInt4Weight, int8_weight
from tram.model.quant.weights import QuantizedWeight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_KERNEL_GROUP = 32  # the int4 kernel reads 32 k at a time; groups and K must be multiples of it

Parts = dict[str, torch.Tensor]


@dataclass
class Int4Parts:
    """Unpacked 4-bit weight: q [N, K] uint8 0..15, scale [N, G] float32, zero [N, G] uint8 0..15 or
    None (8), group size, g_idx [K] int64 or None (k // group)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group: int
    g_idx: torch.Tensor | None = None

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


def gptq_parts(parts: Parts, group_size: int, v1: bool) -> Int4Parts:
    q = unpack_int32(parts["qweight"], dim=0).t()  # [N, K]
    n, k = q.shape
    zero = unpack_int32(parts["qzeros"], dim=1)[:, :n]  # [G, N]
    if v1:
        zero = (zero + 1) & 15  # v1 stores z - 1 (the classic off-by-one, kept for compatibility)
    g_idx = parts.get("g_idx")
    g_idx = None if g_idx is None else g_idx.long()
    group = k if group_size <= 0 else group_size
    return Int4Parts(q.to(torch.uint8), parts["scales"].float().t(), zero.t().to(torch.uint8), group, g_idx)


def awq_parts(parts: Parts, group_size: int) -> Int4Parts:
    q = unpack_int32(parts["qweight"], dim=1, order=AWQ_ORDER).t()  # [N, K]
    zero = unpack_int32(parts["qzeros"], dim=1, order=AWQ_ORDER).t()  # [N, G]
    group = q.shape[1] if group_size <= 0 else group_size
    return Int4Parts(q.to(torch.uint8), parts["scales"].float().t(), zero.to(torch.uint8), group)


def compressed_int4_parts(parts: Parts, group_size: int | None, symmetric: bool) -> Int4Parts:
    n, k = (int(v) for v in parts["weight_shape"].tolist())
    q = unpack_int32(parts["weight_packed"], dim=1)[:, :k]  # [N, K], q + 8
    zero = None
    if not symmetric:
        zero = unpack_int32(parts["weight_zero_point"], dim=0)[:n].to(torch.uint8)  # [N, G], z + 8
    g_idx = parts.get("weight_g_idx")
    group = k if not group_size or group_size <= 0 else group_size
    scale = parts["weight_scale"].float().reshape(n, -1)
    return Int4Parts(q.to(torch.uint8), scale, zero, group, None if g_idx is None else g_idx.long())


def compressed_int8(parts: Parts) -> QuantizedWeight:
    """compressed-tensors 8-bit, symmetric per channel: int-quantized (int8 weight) or pack-quantized."""
    if "weight_packed" in parts:
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        q = (unpack_int32(parts["weight_packed"], dim=1, bits=8)[:, :k] - 128).to(torch.int8)
    else:
        q = parts["weight"]
        n = q.shape[0]
    return int8_weight(q, parts["weight_scale"].reshape(n))


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
