"""Triton GEMM y = x @ W.T (+ bias) for the weight-only layouts of weights.py (W8A16 / W4A16).

Each program owns a [BLOCK_M, BLOCK_N] tile of y and walks K in tiles of BLOCK_K, widening the
packed weight tile in registers, so W is read from memory in its packed form only:

  * int8 (group 0): q is an exact integer in fp16/bf16, so tl.dot(x, q) accumulates in fp32 and
    the per-row scale multiplies the accumulator once at the end instead of every weight.
  * int4: a K tile never straddles a group (BLOCK_K divides the group), so one scale (and, for a
    checkpoint's asymmetric int4, one integer zero point) per output column serves the whole tile;
    (q - zero) * scale, zero 8 where symmetric, is formed in fp32 and rounded to x's dtype for
    tl.dot. Tram's nibble layout keeps k = j in the low and k = j + 16 in the high nibble of byte j
    of each run of 32, so instead of interleaving nibbles the kernel gathers the matching x columns
    and issues two dots of BLOCK_K / 2: one for the low nibbles, one for the high.

fp32 x multiplies with exact ("ieee") dots, as the attention kernels do. Triton's interpreter
cannot tl.dot bfloat16: there the tiles are widened to fp32 first (DOT_F32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _int8_linear_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_ym,
    stride_yn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < M
    n_ok = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + n.to(tl.int64)[None, :] * K  # qweight [N, K] contiguous, read as [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # per-channel int8 allows any K: mask the last tile
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(x_rows + k[None, :] * stride_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        q = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0)
        if DOT_F32:
            x = x.to(tl.float32)
        acc = tl.dot(x, q.to(x.dtype), acc, input_precision=DOT_PRECISION)
    acc *= tl.load(scale_ptr + n, mask=n_ok, other=0.0)[None, :]
    _store(acc, bias_ptr, y_ptr, m, n, m_ok, n_ok, stride_ym, stride_yn, HAS_BIAS)


@triton.jit
def _int4_linear_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_ym,
    stride_yn,
    GROUP: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # BLOCK_K: 32 | BLOCK_K | GROUP
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < M
    n_ok = n < N
    half = tl.arange(0, BLOCK_K // 2)
    k_lo = (half // 16) * 32 + half % 16  # the k held by the low nibble of byte `half` of the tile
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + n.to(tl.int64)[None, :] * (K // 2)  # qweight [N, K / 2] contiguous
    scale_cols = scale_ptr + n.to(tl.int64) * (K // GROUP)  # scale (and zero) [N, K / GROUP] contiguous
    zero_cols = zero_ptr + n.to(tl.int64) * (K // GROUP)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # K is a multiple of GROUP, hence of BLOCK_K: no K mask
        packed = tl.load(w_cols + (k0 // 2 + half)[:, None], mask=n_ok[None, :], other=0)  # [BLOCK_K / 2, BLOCK_N]
        s = tl.load(scale_cols + k0 // GROUP, mask=n_ok, other=0.0)[None, :]
        if HAS_ZERO:  # (q - zero) is exact in fp32, as the CPU kernels keep it
            z = tl.load(zero_cols + k0 // GROUP, mask=n_ok, other=0).to(tl.float32)[None, :]
        else:
            z = 8.0
        x_lo = tl.load(x_rows + (k0 + k_lo)[None, :] * stride_xk, mask=m_ok[:, None], other=0.0)
        x_hi = tl.load(x_rows + (k0 + k_lo + 16)[None, :] * stride_xk, mask=m_ok[:, None], other=0.0)
        if DOT_F32:
            x_lo = x_lo.to(tl.float32)
            x_hi = x_hi.to(tl.float32)
        w_lo = (((packed & 15).to(tl.float32) - z) * s).to(x_lo.dtype)
        w_hi = (((packed >> 4).to(tl.float32) - z) * s).to(x_lo.dtype)
        acc = tl.dot(x_lo, w_lo, acc, input_precision=DOT_PRECISION)
        acc = tl.dot(x_hi, w_hi, acc, input_precision=DOT_PRECISION)
    _store(acc, bias_ptr, y_ptr, m, n, m_ok, n_ok, stride_ym, stride_yn, HAS_BIAS)


@triton.jit
def _store(acc, bias_ptr, y_ptr, m, n, m_ok, n_ok, stride_ym, stride_yn, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:  # added in fp32: y is rounded to its dtype once, as in reference_linear
        acc += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + m.to(tl.int64)[:, None] * stride_ym + n[None, :] * stride_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


_INTERPRETED = type(_int8_linear_kernel).__name__ == "InterpretedFunction"  # TRITON_INTERPRET=1 at import


def _block_k(group: int, preferred: int) -> int:
    """int8: `preferred`. int4: the largest of 128/64/32 up to `preferred` that divides the group."""
    if group == 0:
        return preferred
    return next(b for b in (128, 64, 32) if b <= preferred and group % b == 0)


def quant_linear_config(rows: int, group: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps): starting points, not yet tuned on a GPU. A decode
    (few rows) is bound by reading W: the shortest row tile tl.dot takes (16), long K tiles, narrow
    N tiles so that enough programs cover the GPU. A prefill is bound by compute: taller tiles re-read
    each weight tile fewer times."""
    if rows <= 16:
        return 16, 32, _block_k(group, 128), 4
    if rows <= 64:
        return 32, 64, _block_k(group, 64), 4
    return 64, 128, _block_k(group, 64), 8


def triton_quant_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    group: int,
    bias: torch.Tensor | None = None,
    config: tuple[int, int, int, int] | None = None,
    zero: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x @ W.T + bias in x's dtype, W given as weights.py stores it: group 0 is Int8Weight
    (qweight int8 [N, K], scale [N]), else Int4Weight (qweight uint8 [N, K / 2], scale [N, K / group],
    and a checkpoint's uint8 zero points of the same shape, or None: 8). x [..., K] is fp16, bf16 or
    fp32, any strides; `config` overrides quant_linear_config."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)  # [M, K]
    rows, n = x2.shape[0], qweight.shape[0]
    if group == 0:
        assert qweight.dtype == torch.int8 and qweight.shape == (n, k) and scale.shape == (n,), (
            qweight.shape,
            scale.shape,
        )
    else:
        assert group % 32 == 0 and k % group == 0, (group, k)
        assert qweight.dtype == torch.uint8 and qweight.shape == (n, k // 2), qweight.shape
        assert scale.shape == (n, k // group), scale.shape
        assert zero is None or (zero.dtype == torch.uint8 and zero.shape == scale.shape and zero.is_contiguous())
    assert qweight.is_contiguous() and scale.is_contiguous() and scale.dtype == torch.float32
    assert bias is None or bias.shape == (n,), bias.shape
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return y.view(*lead, n)
    block_m, block_n, block_k, num_warps = config or quant_linear_config(rows, group)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
    bias_arg = y if bias is None else bias  # a pointer the kernel never reads where there is no bias
    strides = (*x2.stride(), *y.stride())
    common = dict(
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,  # exact fp32; default otherwise
        DOT_F32=_INTERPRETED and x.dtype == torch.bfloat16,
        num_warps=num_warps,
    )
    if group == 0:
        assert zero is None, "int8 weights are symmetric"
        _int8_linear_kernel[grid](x2, qweight, scale, bias_arg, y, rows, n, k, *strides, **common)
    else:
        _int4_linear_kernel[grid](
            x2,
            qweight,
            scale,
            scale if zero is None else zero,
            bias_arg,
            y,
            rows,
            n,
            k,
            *strides,
            GROUP=group,
            HAS_ZERO=zero is not None,
            **common,
        )
    return y.view(*lead, n)
