"""Triton kernels for paged attention over the KV cache layout of base.py.

* `write_kv_cache`: one program per token scatters the token's K and V (all kv heads) into its slot.
* `paged_attention`: one "unified" kernel for a flattened batch that mixes prefill chunks (with or
  without a cached prefix) and decodes. Each program owns a tile of BLOCK_M rows = BLOCK_Q query
  tokens of one request x the GROUP query heads that share one kv head (row r is token r // GROUP,
  head r % GROUP), so a decode still feeds tl.dot with M >= 16 when GROUP > 1. The program walks
  the request's KV positions in tiles of TILE_N keys through its block table with an online
  softmax in fp32, visiting only the tiles that intersect the causal (and sliding) window of its
  rows.
* Requests are found on the device: program p of the first grid axis is the q-th query block of
  request i where i is found by binary search over query_start_loc (request i's first block is
  number query_start_loc[i] // BLOCK_Q + i; programs past a request's last block return). The
  grid is (cdiv(T, BLOCK_Q) + num_reqs, num_kv_heads, num_splits): host ints only, so a captured
  CUDA graph replays correctly whatever seq_lens, block tables and query_start_loc hold.
* Split-K (flash-decoding), num_splits > 1: each program splits the KV tiles of its own range
  (computed on the device from seq_lens) into num_splits contiguous shares, stores its partial
  (max, sum of exponentials, unnormalized output) in fp32 workspaces, and `_reduce_splits_kernel`
  merges the shares. It is exact for prefill rows too.

Contract: query_start_loc[num_reqs] <= T; out rows past it are left untouched. A request with
seq_len 0 (CUDA-graph padding, query_len 1) reads no KV and gets zeros. Any head_dim works: tiles
are padded to a power of two >= 16 (tl.dot's minimum) and masked. query/out share one dtype (fp16,
bf16 or fp32); the cache has that dtype or is fp8 (float8_e4m3fn / float8_e5m2, see kv_quant.py).
No function here syncs with the device.

Soft-capped scores (Gemma 2: cap * tanh(score / cap) before the mask and softmax), when
logits_soft_cap is set: the kernel then takes the score scale divided by the cap, applies `_tanh`,
and multiplies by cap * log2(e) into the log2 domain; without a cap the kernel is the same as before
(SOFT_CAP is a compile-time switch).

Attention sinks (gpt-oss: a logit per query head that joins the softmax's denominator and adds no
value), when sinks is given: the sink (in the log2 domain) joins a row's running maximum and sum once,
after its last KV tile, or in `_reduce_splits_kernel` after the splits merge (HAS_SINKS is a
compile-time switch, so a model without sinks runs the kernel as before).

fp8 cache: `write_kv_cache` stores saturate(k / k_scale) rounded to nearest even on the fp8 grid in
float32 first (`_round_to_fp8`), so the final cast is exact on any GPU and in Triton's interpreter
(whose own fp8 rounding is not nearest-even). `paged_attention` widens fp8 tiles to the query's dtype
(exact: every fp8 value is a float16 and a bfloat16) and folds k_scale into the score scale and
v_scale into the output, so a cache with scales of 1 costs no multiply per element.
"""

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
# fp8 cache dtype -> (largest finite value, mantissa bits, exponent of the smallest normal)
_FP8_FORMATS = {torch.float8_e4m3fn: (448.0, 3, -6), torch.float8_e5m2: (57344.0, 2, -14)}


@triton.jit
def _round_to_fp8(x, FP8_MAX: tl.constexpr, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr):
    """x (float32) saturated to +-FP8_MAX and rounded to nearest even on the fp8 grid, still float32."""
    bits = x.to(tl.int32, bitcast=True)
    a = tl.minimum(tl.abs(x), FP8_MAX)
    # The fp8 spacing in a's binade (subnormals share the smallest normal binade's) is the float32 ulp
    # of c = 2^(e - MANT_BITS + 23): adding c rounds a to that spacing in float32's nearest-even.
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, MIN_EXP)
    c = ((e - MANT_BITS + 23 + 127) << 23).to(tl.float32, bitcast=True)
    r = (a + c) - c
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


# --------------------------------------------------------------------------------------- KV write


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_ptr,
    k_scale,
    v_scale,  # fp8 only: stored = x / scale
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_c_kv,
    stride_c_blk,
    stride_c_off,
    stride_c_h,
    stride_c_d,
    num_kv_heads,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MANT_BITS: tl.constexpr,
    MIN_EXP: tl.constexpr,  # FP8_MAX 0: not an fp8 cache
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:  # a padding token
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < HEAD_DIM)
    k = tl.load(key_ptr + tok * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    if FP8_MAX > 0:
        k = _round_to_fp8(k.to(tl.float32) / k_scale, FP8_MAX, MANT_BITS, MIN_EXP).to(cache_ptr.dtype.element_ty)
        v = _round_to_fp8(v.to(tl.float32) / v_scale, FP8_MAX, MANT_BITS, MIN_EXP).to(cache_ptr.dtype.element_ty)
    dst = cache_ptr + (slot // BLOCK_SIZE) * stride_c_blk + (slot % BLOCK_SIZE) * stride_c_off
    dst += h * stride_c_h + d * stride_c_d
    tl.store(dst, k, mask=mask)
    tl.store(dst + stride_c_kv, v, mask=mask)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """key/value [T, Hkv, D]; slot_mapping [T] int64; slot < 0 means a padding token: skip it. An
    fp8 cache stores x / scale, saturated, rounded to nearest even."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape and slot_mapping.shape == (num_tokens,), (key.shape, slot_mapping.shape)
    assert kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[3:] == (num_kv_heads, head_dim)
    if num_tokens == 0:
        return
    fp8_max, mant_bits, min_exp = _FP8_FORMATS.get(kv_cache.dtype, (0.0, 0, 0))
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        *key.stride(),
        *value.stride(),
        *kv_cache.stride(),
        num_kv_heads,
        BLOCK_SIZE=kv_cache.shape[2],
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        FP8_MAX=fp8_max,
        MANT_BITS=mant_bits,
        MIN_EXP=min_exp,
        num_warps=_write_num_warps(num_kv_heads * head_dim),
    )


def _write_num_warps(elements: int) -> int:
    return 1 if elements <= 512 else 2 if elements <= 2048 else 4


# -------------------------------------------------------------------------------------- attention


@triton.jit
def _tanh(x):
    """tanh in fp32 from exp2 of a non-positive argument, which neither overflows nor loses the sign:
    tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|)."""
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 * log2(e)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _find_request(qsl_ptr, q_block, num_reqs, BLOCK_Q: tl.constexpr):
    """The request whose query blocks include q_block: the last i with qsl[i] // BLOCK_Q + i <= q_block."""
    lo = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attention_kernel(
    q_ptr,
    cache_ptr,
    out_ptr,
    qsl_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    ws_acc_ptr,
    ws_m_ptr,
    ws_l_ptr,  # split-K workspaces; unused when NUM_SPLITS == 1
    sinks_ptr,  # HAS_SINKS only: [num_heads] float32
    qk_scale,  # softmax scale * log2(e) (* k_scale for an fp8 cache): scores live in the log2 domain;
    # with SOFT_CAP, softmax scale / cap (* k_scale): the argument of tanh
    cap_log2,  # SOFT_CAP only: cap * log2(e), taking tanh's result to the log2 domain
    v_scale,  # fp8 cache only: multiplies the output
    num_reqs,
    num_tokens,
    num_heads,
    window,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_c_kv,
    stride_c_blk,
    stride_c_off,
    stride_c_h,
    stride_c_d,
    stride_bt,
    GROUP: tl.constexpr,  # query heads per kv head
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # BLOCK_D: head_dim padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,  # multiply in fp32 (Triton's interpreter cannot tl.dot bfloat16)
    KV_FP8: tl.constexpr,  # the cache holds fp8: widened to q's dtype as loaded
    SOFT_CAP: tl.constexpr,  # scores soft-capped (cap_log2 * tanh(dot * qk_scale))
    HAS_SINKS: tl.constexpr,  # a sink logit per head in the denominator (joined here unless split)
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    req = _find_request(qsl_ptr, q_block, num_reqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + req)
    q_len = tl.load(qsl_ptr + req + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + req)
    if local_block * BLOCK_Q >= q_len:  # past this request's last query block
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len  # query token j sits at position ctx_len + j

    rows = tl.arange(0, BLOCK_M)
    q_idx = local_block * BLOCK_Q + rows // GROUP  # token index within the request
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    q_pos = ctx_len + q_idx
    tok = (q_start + q_idx).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM  # padded dims load as 0: they add nothing to any dot product
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_valid[:, None] & d_ok[None, :],
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)

    # KV positions any row of this tile may see: [lo, hi). A seq_len-0 padding request gets hi = 0.
    hi = tl.maximum(tl.minimum(ctx_len + (local_block + 1) * BLOCK_Q, seq_len), 0)
    tile_lo = 0
    if USE_WINDOW:
        tile_lo = tl.maximum(ctx_len + local_block * BLOCK_Q - window + 1, 0) // TILE_N
    tile_hi = (hi + TILE_N - 1) // TILE_N
    if NUM_SPLITS > 1:  # this split's contiguous share of the tiles
        per_split = (tile_hi - tile_lo + NUM_SPLITS - 1) // NUM_SPLITS
        tile_lo = tile_lo + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, tile_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + req.to(tl.int64) * stride_bt
    head_off = kv_head.to(tl.int64) * stride_c_h
    offs_n = tl.arange(0, TILE_N)
    for t in range(tile_lo, tile_hi):
        k_pos = t * TILE_N + offs_n
        k_valid = k_pos < hi
        blk = tl.load(table + k_pos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)
        kv_off = blk * stride_c_blk + (k_pos % BLOCK_SIZE) * stride_c_off + head_off
        k_t = tl.load(
            cache_ptr + kv_off[None, :] + d[:, None] * stride_c_d, mask=k_valid[None, :] & d_ok[:, None], other=0.0
        )  # [BLOCK_D, TILE_N]
        v = tl.load(
            cache_ptr + stride_c_kv + kv_off[:, None] + d[None, :] * stride_c_d,
            mask=k_valid[:, None] & d_ok[None, :],
            other=0.0,
        )  # [TILE_N, BLOCK_D]
        if DOT_F32 or KV_FP8:
            k_t = k_t.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
        if SOFT_CAP:
            s = _tanh(s) * cap_log2
        seen = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]
        if USE_WINDOW:
            seen = seen & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet stay at 0
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if KV_FP8:
        acc = acc * v_scale
    if NUM_SPLITS == 1:
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + head, mask=row_valid, other=0.0).to(tl.float32) * 1.4426950408889634
            m_top = tl.maximum(m_i, sink)  # the sink may exceed every score: rescale to it
            alpha = tl.exp2(m_i - m_top)  # 0 for a row that saw no key
            acc = acc * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - m_top)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
            o.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & d_ok[None, :],
        )
    else:  # workspaces are contiguous [NUM_SPLITS, T, Hq] (x HEAD_DIM for acc)
        ws = (split * num_tokens + tok) * num_heads + head
        tl.store(ws_m_ptr + ws, m_i, mask=row_valid)
        tl.store(ws_l_ptr + ws, l_i, mask=row_valid)
        tl.store(ws_acc_ptr + ws[:, None] * HEAD_DIM + d[None, :], acc, mask=row_valid[:, None] & d_ok[None, :])


@triton.jit
def _reduce_splits_kernel(
    out_ptr,
    ws_acc_ptr,
    ws_m_ptr,
    ws_l_ptr,
    sinks_ptr,  # HAS_SINKS only: [num_heads] float32
    qsl_ptr,
    num_reqs,
    num_tokens,
    num_heads,
    stride_ot,
    stride_oh,
    stride_od,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if tok >= tl.load(qsl_ptr + num_reqs):  # not a token of any request: no split wrote it
        return
    s = tl.arange(0, SPLITS_P2)
    s_valid = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    ws = (s * num_tokens + tok) * num_heads + head
    m = tl.load(ws_m_ptr + ws, mask=s_valid, other=float("-inf"))
    row_sum = tl.load(ws_l_ptr + ws, mask=s_valid, other=0.0)
    acc = tl.load(ws_acc_ptr + ws[:, None] * HEAD_DIM + d[None, :], mask=s_valid[:, None] & d_ok[None, :], other=0.0)
    m_max = tl.max(m, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        m_max = tl.maximum(m_max, sink)
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_ref)  # empty splits weigh 0
    total = tl.sum(w * row_sum, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_ref)
    o = tl.sum(w[:, None] * acc, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + d * stride_od, o.to(out_ptr.dtype.element_ty), mask=d_ok)


_INTERPRETED = type(_attention_kernel).__name__ == "InterpretedFunction"  # TRITON_INTERPRET=1 at import


def _attention_config(group: int, max_query_len: int, head_dim: int, elem_size: int) -> tuple[int, int, int]:
    """(BLOCK_M, TILE_N, num_warps): starting points, to be tuned on the target GPU. Without spills
    when compiled for sm_90 (ptxas): ~80 registers for decode tiles (16 x 128, fp16), ~160 for
    64 x 128 prefill tiles at 4 warps; fp32 (exact "ieee" dots on CUDA cores) needs 8 warps there."""
    min_m = triton.next_power_of_2(group)  # all heads of one query token share a tile
    if max_query_len >= 64:  # long prefill chunks: taller tiles re-read each KV tile fewer times
        block_m = max(64 if head_dim <= 128 else 32, min_m)
    else:
        block_m = max(16, min_m)
    num_warps = 8 if block_m * head_dim * elem_size > 64 * 128 * 2 else 4
    return block_m, 32, num_warps


def _score_scales(scale: float, logits_soft_cap: float | None) -> tuple[float, float]:
    """(qk_scale, cap_log2) of `_attention_kernel`: the dot product's multiplier, then tanh's (soft-cap only)."""
    if logits_soft_cap is None:
        return scale * _LOG2E, 1.0
    return scale / logits_soft_cap, logits_soft_cap * _LOG2E


def paged_attention(
    query: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    out: torch.Tensor,  # [T, Hq, D], written
    query_start_loc: torch.Tensor,  # [B+1] int32 (device), cumulative query lengths
    seq_lens: torch.Tensor,  # [B] int32 (device), context length incl. this step's tokens
    block_tables: torch.Tensor,  # [B, max_blocks] int32 (device)
    scale: float,
    *,
    num_reqs: int,
    max_query_len: int,
    sliding_window: int | None = None,
    num_splits: int = 1,
    k_scale: float = 1.0,
    v_scale: float = 1.0,  # an fp8 cache's K/V are read as stored * scale
    logits_soft_cap: float | None = None,  # scores -> cap * tanh(score / cap) before mask and softmax
    sinks: torch.Tensor | None = None,  # [Hq] float32 (device): logits in the softmax's denominator only
) -> None:
    """Causal attention of each request's query tokens over its paged context (see module doc)."""
    num_tokens, num_heads, head_dim = query.shape
    assert kv_cache.dim() == 5 and kv_cache.shape[0] == 2, kv_cache.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    assert kv_cache.shape[4] == head_dim and out.shape == query.shape, (query.shape, kv_cache.shape, out.shape)
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    kv_fp8 = kv_cache.dtype in _FP8_FORMATS
    assert query.dtype == out.dtype and (kv_fp8 or kv_cache.dtype == query.dtype), (query.dtype, kv_cache.dtype)
    assert block_tables.dim() == 2 and block_tables.stride(1) == 1, block_tables.stride()
    assert num_splits >= 1 and (sliding_window is None or sliding_window >= 1), (num_splits, sliding_window)
    assert logits_soft_cap is None or logits_soft_cap > 0, logits_soft_cap
    assert sinks is None or sinks.shape == (num_heads,), (None if sinks is None else sinks.shape, num_heads)
    if num_tokens == 0 or num_reqs == 0:
        return
    sinks_arg = out if sinks is None else sinks.detach().to(torch.float32).contiguous()  # out: a placeholder
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m, tile_n, num_warps = _attention_config(group, max_query_len, block_d, query.element_size())
    block_q = block_m // group
    grid = (triton.cdiv(num_tokens, block_q) + num_reqs, num_kv_heads, num_splits)
    if num_splits > 1:
        dev = query.device
        ws_acc = torch.empty((num_splits, num_tokens, num_heads, head_dim), dtype=torch.float32, device=dev)
        ws_m = torch.empty((num_splits, num_tokens, num_heads), dtype=torch.float32, device=dev)
        ws_l = torch.empty((num_splits, num_tokens, num_heads), dtype=torch.float32, device=dev)
    else:
        ws_acc = ws_m = ws_l = out  # placeholders, never touched
    _attention_kernel[grid](
        query,
        kv_cache,
        out,
        query_start_loc,
        seq_lens,
        block_tables,
        ws_acc,
        ws_m,
        ws_l,
        sinks_arg,
        *_score_scales(scale * (k_scale if kv_fp8 else 1.0), logits_soft_cap),
        float(v_scale),
        num_reqs,
        num_tokens,
        num_heads,
        sliding_window or 0,
        *query.stride(),
        *out.stride(),
        *kv_cache.stride(),
        block_tables.stride(0),
        GROUP=group,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        USE_WINDOW=sliding_window is not None,
        NUM_SPLITS=num_splits,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else None,  # exact fp32; default otherwise
        DOT_F32=_INTERPRETED and query.dtype == torch.bfloat16,
        KV_FP8=kv_fp8,
        SOFT_CAP=logits_soft_cap is not None,
        HAS_SINKS=sinks is not None,
        num_warps=num_warps,
    )
    if num_splits > 1:
        _reduce_splits_kernel[(num_tokens, num_heads)](
            out,
            ws_acc,
            ws_m,
            ws_l,
            sinks_arg,
            query_start_loc,
            num_reqs,
            num_tokens,
            num_heads,
            *out.stride(),
            NUM_SPLITS=num_splits,
            SPLITS_P2=triton.next_power_of_2(num_splits),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            HAS_SINKS=sinks is not None,
            num_warps=1 if block_d <= 64 else 2,
        )
