"""Triton fused mixture-of-experts for float expert weights (fp32 / bf16 / fp16), stacked over E.

The (token, slot) pairs are grouped by expert into blocks of BLOCK_M rows, each block holding pairs of
one expert only and padded with a sentinel pair id (`align_pairs`, torch ops without a host sync). Two
grouped GEMM launches then run over (block, N tile) programs, each reading its block's expert id:

  1. h = x[token] @ w13[e].T (+ b13[e]) with the gate and up tiles of the same columns side by side in
     two accumulators, so the activation is applied in registers and only act [pairs, I] is written
     (in x's dtype: the operand of the second dot).
  2. y = act @ w2[e].T (+ b2[e]), times the pair's routing weight, written in fp32 to its own row of
     [pairs, H]. A slot of expert -1 is in no block: its row stays zero.

The per-token sum over the k slots is a fixed-order torch sum in fp32, so the result does not depend
on scheduling (no atomics), rounded once to x's dtype.

fp32 operands multiply with exact ("ieee") dots, as the repo's other kernels do. Triton's
interpreter cannot tl.dot bfloat16: there the tiles are widened to fp32 first (DOT_F32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}


@triton.jit
def _w13_act_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    act_ptr,
    pair_ids_ptr,
    block_expert_ptr,
    num_pairs,
    inter,
    hidden,
    stride_xm,
    stride_xk,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    block = tl.program_id(0)
    e = tl.load(block_expert_ptr + block).to(tl.int64)
    if e < 0:  # a block past the last expert's padding: nothing to do
        return
    pairs = tl.load(pair_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    m_ok = pairs < num_pairs  # padding rows hold the sentinel num_pairs
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < inter
    x_rows = x_ptr + (pairs // TOP_K)[:, None] * stride_xm
    w_e = w_ptr + e * (2 * inter) * hidden  # w13 [E, 2I, H] contiguous, read as [BLOCK_K, BLOCK_N]
    gate_cols = w_e + n.to(tl.int64)[None, :] * hidden
    up_cols = gate_cols + inter * hidden
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < hidden
        x = tl.load(x_rows + k[None, :] * stride_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(gate_cols + k[:, None], mask=w_mask, other=0.0)
        wu = tl.load(up_cols + k[:, None], mask=w_mask, other=0.0)
        if DOT_F32:
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        acc_g = tl.dot(x, wg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(x, wu, acc_u, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        b_e = b_ptr + e * (2 * inter)
        acc_g += tl.load(b_e + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_e + inter + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    act = _activation(acc_g, acc_u, alpha, limit, ACT)
    out = act_ptr + pairs[:, None] * inter + n[None, :]
    tl.store(out, act.to(act_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _activation(g, u, alpha, limit, ACT: tl.constexpr):
    if ACT == 0:  # silu(gate) * up
        return g * tl.sigmoid(g) * u
    else:  # gpt-oss: clamped, with its own sigmoid slope and a +1 on up
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        return (u + 1.0) * g * tl.sigmoid(alpha * g)


@triton.jit
def _w2_kernel(
    act_ptr,
    w_ptr,
    b_ptr,
    topk_w_ptr,
    y_ptr,
    pair_ids_ptr,
    block_expert_ptr,
    num_pairs,
    hidden,
    inter,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    block = tl.program_id(0)
    e = tl.load(block_expert_ptr + block).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(pair_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    m_ok = pairs < num_pairs
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    a_rows = act_ptr + pairs[:, None] * inter
    w_cols = w_ptr + e * hidden * inter + n.to(tl.int64)[None, :] * inter  # w2 [E, H, I] contiguous
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < inter
        a = tl.load(a_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + e * hidden + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    acc *= tl.load(topk_w_ptr + pairs, mask=m_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + pairs[:, None] * hidden + n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


_INTERPRETED = type(_w2_kernel).__name__ == "InterpretedFunction"  # TRITON_INTERPRET=1 at import


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair_ids, block_expert): the flat (token * k + slot) pair ids sorted by expert, each expert's
    run padded to a multiple of block_m with the sentinel topk_ids.numel(), and the expert of each
    block of block_m (-1 for the blocks past the last run). Pairs of expert -1 are left out. Sized by
    an upper bound rather than the real count, so that nothing waits on the device."""
    num_pairs = topk_ids.numel()
    device = topk_ids.device
    ids = topk_ids.reshape(-1).long()
    ids = torch.where(ids < 0, num_experts, ids)  # skipped pairs sort after every expert
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    run_start = torch.cumsum(counts, 0) - counts  # where each expert's pairs begin in `order`
    # Each non-empty expert adds fewer than block_m padding rows.
    capacity = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m) * block_m
    rank = torch.arange(num_pairs, device=device) - run_start[sorted_ids]
    padded_start = (ends - padded)[sorted_ids.clamp(max=num_experts - 1)]
    dest = torch.where(sorted_ids < num_experts, padded_start + rank, capacity)  # skipped: a dump slot
    pair_ids = torch.full((capacity + 1,), num_pairs, dtype=torch.int32, device=device)
    pair_ids[dest] = order.to(torch.int32)
    block_start = torch.arange(0, capacity, block_m, device=device)
    block_expert = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return pair_ids[:capacity], block_expert


def fused_moe_config(num_pairs: int, num_experts: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps): starting points, not yet tuned on a GPU. Few rows per
    expert (decode) is bound by reading the weights: the shortest row tile tl.dot takes and long K
    tiles. Many rows per expert (prefill) is bound by compute: taller blocks re-read each weight tile
    fewer times."""
    rows_per_expert = num_pairs / max(num_experts, 1)
    if rows_per_expert <= 16:
        return 16, 64, 64, 4
    if rows_per_expert <= 64:
        return 32, 64, 64, 4
    return 64, 64, 32, 4


def _check_args(x, topk_ids, topk_weights, w13, w2, b13, b2) -> tuple[int, int, int]:
    num_experts, two_i, h = w13.shape
    i = two_i // 2
    assert x.shape[-1] == h and two_i == 2 * i, (x.shape, w13.shape)
    assert w2.shape == (num_experts, h, i), (w2.shape, w13.shape)
    assert w13.dtype == w2.dtype == x.dtype, (x.dtype, w13.dtype, w2.dtype)
    assert w13.is_contiguous() and w2.is_contiguous()
    assert topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == x.reshape(-1, h).shape[0]
    assert not topk_ids.is_floating_point()
    assert b13 is None or (b13.shape == (num_experts, two_i) and b13.is_contiguous()), b13
    assert b2 is None or (b2.shape == (num_experts, h) and b2.is_contiguous()), b2
    return num_experts, h, i


def triton_fused_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    activation: str,
    alpha: float = 1.702,
    limit: float = 7.0,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """out[t] = sum over slots j with topk_ids[t, j] >= 0 of topk_weights[t, j] * expert e's MLP of
    x[t] (w13 [E, 2I, H] gate rows then up rows, w2 [E, H, I], optional biases b13 [E, 2I], b2 [E, H]),
    in x's dtype. x [T, H]; topk_ids / topk_weights [T, k]; `config` overrides fused_moe_config."""
    num_experts, h, i = _check_args(x, topk_ids, topk_weights, w13, w2, b13, b2)
    x2 = x.reshape(-1, h)
    num_tokens, top_k = topk_ids.shape
    num_pairs = num_tokens * top_k
    if num_pairs == 0 or num_experts == 0:
        return torch.zeros_like(x2).view(x.shape)
    assert activation in ACTIVATIONS, activation
    block_m, block_n, block_k, num_warps = config or fused_moe_config(num_pairs, num_experts)
    pair_ids, block_expert = align_pairs(topk_ids, num_experts, block_m)
    act = torch.empty((num_pairs, i), dtype=x.dtype, device=x.device)  # rows of skipped pairs: never read
    y = torch.zeros((num_pairs, h), dtype=torch.float32, device=x.device)  # skipped pairs: stay zero
    common = dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
        DOT_F32=_INTERPRETED and x.dtype == torch.bfloat16,
        num_warps=num_warps,
    )
    # Block index on the fast axis: the blocks of one expert, which share a weight tile, run together.
    num_blocks = block_expert.shape[0]
    _w13_act_kernel[(num_blocks, triton.cdiv(i, block_n))](
        x2,
        w13,
        w13 if b13 is None else b13,
        act,
        pair_ids,
        block_expert,
        num_pairs,
        i,
        h,
        *x2.stride(),
        float(alpha),
        float(limit),
        TOP_K=top_k,
        ACT=ACTIVATIONS[activation],
        HAS_BIAS=b13 is not None,
        **common,
    )
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    _w2_kernel[(num_blocks, triton.cdiv(h, block_n))](
        act,
        w2,
        w2 if b2 is None else b2,
        weights,
        y,
        pair_ids,
        block_expert,
        num_pairs,
        h,
        i,
        HAS_BIAS=b2 is not None,
        **common,
    )
    return y.view(num_tokens, top_k, h).sum(1).to(x.dtype).view(x.shape)
