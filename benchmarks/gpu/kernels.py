"""Section `kernels`: Tram's Triton kernels (write_kv_cache, paged_attention) against PyTorch SDPA on
the equivalent dense problems, with a correctness check against a float32 reference."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tram.bench.timing import median_ms, sync

from gpu.common import Ctx, head_dim, hf_config, log, measure_copy_bandwidth, parse_ints  # isort: skip

# Relative error of a bf16/fp16 attention against a float32 reference: rounding of the operands lands
# between 1e-3 and 1e-2 (METHOD.md); above this the kernel computes something else.
ATTN_REL_TOL = 2e-2


@dataclass
class AttnShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    device: torch.device

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


@dataclass
class PagedProblem:
    """One batch of equal requests, in the paged layout Tram's kernels read and as dense SDPA inputs."""

    query: torch.Tensor  # [B * q_len, Hq, D]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, Hkv, D]
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, blocks per sequence] int32
    dense_q: torch.Tensor  # [B, Hq, q_len, D]
    dense_k: torch.Tensor  # [B, Hkv, context, D]
    dense_v: torch.Tensor  # [B, Hkv, context, D]
    mask: torch.Tensor | None  # [q_len, context] bool, True = attend (a chunk after a cached prefix)
    causal: bool  # a whole prompt: plain causal

    @property
    def batch(self) -> int:
        return self.dense_q.shape[0]

    @property
    def query_len(self) -> int:
        return self.dense_q.shape[2]


def build_problem(s: AttnShape, batch: int, query_len: int, context: int) -> PagedProblem:
    blocks = -(-context // s.block_size)
    num_blocks = batch * blocks + 1
    kw = dict(dtype=s.dtype, device=s.device)
    # Shuffled blocks, as after real allocation and frees; block 0 is never used, like the engine's padding.
    order = torch.randperm(num_blocks - 1) + 1
    block_tables = order[: batch * blocks].view(batch, blocks).to(torch.int32).to(s.device)
    k = torch.randn(batch, context, s.num_kv_heads, s.head_dim, **kw)
    v = torch.randn(batch, context, s.num_kv_heads, s.head_dim, **kw)
    # Random everywhere else too: a kernel reading past seq_len or the wrong block shows in the error.
    kv_cache = torch.randn(2, num_blocks, s.block_size, s.num_kv_heads, s.head_dim, **kw)
    pos = torch.arange(context, device=s.device)
    slots = (block_tables.long()[:, pos // s.block_size] * s.block_size + pos % s.block_size).flatten()
    kv_cache[0].view(-1, s.num_kv_heads, s.head_dim)[slots] = k.flatten(0, 1)
    kv_cache[1].view(-1, s.num_kv_heads, s.head_dim)[slots] = v.flatten(0, 1)
    query = torch.randn(batch * query_len, s.num_heads, s.head_dim, **kw)
    mask = None
    if 1 < query_len < context:  # query token i sits at position context - query_len + i
        q_pos = torch.arange(context - query_len, context, device=s.device)
        mask = pos[None, :] <= q_pos[:, None]
    return PagedProblem(
        query=query,
        kv_cache=kv_cache,
        query_start_loc=(torch.arange(batch + 1, device=s.device) * query_len).to(torch.int32),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=s.device),
        block_tables=block_tables,
        dense_q=query.view(batch, query_len, s.num_heads, s.head_dim).transpose(1, 2).contiguous(),
        dense_k=k.transpose(1, 2).contiguous(),
        dense_v=v.transpose(1, 2).contiguous(),
        mask=mask,
        causal=query_len > 1 and mask is None,
    )


def sdpa_variants(p: PagedProblem, scale: float) -> dict[str, Callable[[], torch.Tensor]]:
    """SDPA with enable_gqa, and with K/V heads repeated beforehand: PyTorch's fused backends differ in
    what they accept (a boolean mask with GQA can fall back to the math path), so the faster of the
    two is the fair baseline."""
    rep = p.dense_q.shape[1] // p.dense_k.shape[1]
    k_rep, v_rep = p.dense_k.repeat_interleave(rep, dim=1), p.dense_v.repeat_interleave(rep, dim=1)
    q, k, v, mask, causal = p.dense_q, p.dense_k, p.dense_v, p.mask, p.causal
    return {
        "sdpa_gqa": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
        ),
        "sdpa_repeat_kv": lambda: F.scaled_dot_product_attention(
            q, k_rep, v_rep, attn_mask=mask, is_causal=causal, scale=scale
        ),
    }


def reference_error(p: PagedProblem, out: torch.Tensor, scale: float, max_reqs: int = 8) -> float:
    """‖out − ref‖ / ‖ref‖ against float32 SDPA on upcast inputs, over the first few requests (enough
    to catch wrong indexing; all 256 in float32 would cost gigabytes)."""
    n = min(p.batch, max_reqs)
    q, k, v = (t[:n].float() for t in (p.dense_q, p.dense_k, p.dense_v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=p.mask, is_causal=p.causal, scale=scale, enable_gqa=True)
    got = out[: n * p.query_len].float().view(n, p.query_len, q.shape[1], q.shape[3]).transpose(1, 2)
    return float((got - ref).norm() / ref.norm())


def paged_call(tk: Any, p: PagedProblem, out: torch.Tensor, scale: float, splits: int) -> Callable[[], Any]:
    return lambda: tk.paged_attention(
        p.query,
        p.kv_cache,
        out,
        p.query_start_loc,
        p.seq_lens,
        p.block_tables,
        scale,
        num_reqs=p.batch,
        max_query_len=p.query_len,
        sliding_window=None,
        num_splits=splits,
    )


def attention_rows(
    ctx: Ctx,
    tk: Any,
    s: AttnShape,
    case: str,
    batch: int,
    query_len: int,
    context: int,
    splits: list[int],
    bandwidth: float,
) -> list[dict[str, Any]]:
    """One row per num_splits: Tram's paged_attention against the best SDPA variant on one problem."""
    args = ctx.args
    p = build_problem(s, batch, query_len, context)
    sdpa = {
        name: median_ms(fn, s.device, args.kernel_warmup, args.kernel_iters)
        for name, fn in sdpa_variants(p, s.scale).items()
    }
    best = min(sdpa, key=sdpa.__getitem__)
    elem = torch.empty((), dtype=s.dtype).element_size()
    kv_bytes = batch * context * 2 * s.num_kv_heads * s.head_dim * elem
    q_start = context - query_len
    pairs = batch * sum(q_start + i + 1 for i in range(query_len))  # (query, key) pairs attended
    rows = []
    for num_splits in splits:
        out = torch.full_like(p.query, float("nan"))  # poisoned: an unwritten element fails the check
        call = paged_call(tk, p, out, s.scale, num_splits)
        call()
        sync(s.device)
        all_written = bool(torch.isfinite(out).all())
        err = reference_error(p, out, s.scale)
        ms = median_ms(call, s.device, args.kernel_warmup, args.kernel_iters)
        rows.append(
            {
                "case": case,
                "batch": batch,
                "query_len": query_len,
                "context": context,
                "num_splits": num_splits,
                "tram_ms": ms,
                "sdpa_ms": sdpa[best],
                "sdpa_best": best,
                "sdpa_variants_ms": sdpa,
                "speedup_vs_sdpa": sdpa[best] / ms,
                "rel_err": err,
                "all_written": all_written,
                "correct": all_written and err < ATTN_REL_TOL,
                "kv_bytes": kv_bytes,
                "tram_GBps": kv_bytes / (ms * 1e-3) / 1e9,
                "fraction_of_copy_bw": kv_bytes / (ms * 1e-3) / bandwidth,
                "tram_TFLOPs": 4 * pairs * s.num_heads * s.head_dim / (ms * 1e-3) / 1e12,
            }
        )
    return rows


def write_kv_row(ctx: Ctx, tk: Any, s: AttnShape, num_tokens: int) -> dict[str, Any]:
    """write_kv_cache of num_tokens tokens to scattered slots, against torch's index_copy_."""
    args = ctx.args
    num_blocks = 2 * -(-num_tokens // s.block_size) + 1
    kw = dict(dtype=s.dtype, device=s.device)
    kv_cache = torch.randn(2, num_blocks, s.block_size, s.num_kv_heads, s.head_dim, **kw)
    slots = torch.randperm(num_blocks * s.block_size)[:num_tokens].to(s.device)  # int64, as the engine's
    key = torch.randn(num_tokens, s.num_kv_heads, s.head_dim, **kw)
    value = torch.randn(num_tokens, s.num_kv_heads, s.head_dim, **kw)
    flat_k = kv_cache[0].view(-1, s.num_kv_heads, s.head_dim)  # views: writes land in kv_cache
    flat_v = kv_cache[1].view(-1, s.num_kv_heads, s.head_dim)

    def tram() -> None:
        tk.write_kv_cache(key, value, kv_cache, slots)

    def torch_copy() -> None:
        flat_k.index_copy_(0, slots, key)
        flat_v.index_copy_(0, slots, value)

    tram()
    sync(s.device)
    correct = bool(torch.equal(flat_k[slots], key) and torch.equal(flat_v[slots], value))
    tram_ms = median_ms(tram, s.device, args.kernel_warmup, args.kernel_iters)
    torch_ms = median_ms(torch_copy, s.device, args.kernel_warmup, args.kernel_iters)
    moved = 2 * 2 * key.numel() * key.element_size()  # K and V, each read once and written once
    return {
        "num_tokens": num_tokens,
        "tram_ms": tram_ms,
        "torch_index_copy_ms": torch_ms,
        "speedup_vs_torch": torch_ms / tram_ms,
        "correct": correct,
        "bytes_moved": moved,
        "tram_GBps": moved / (tram_ms * 1e-3) / 1e9,
    }


def attn_shape(ctx: Ctx) -> AttnShape:
    cfg = hf_config(ctx.args)
    return AttnShape(
        cfg.num_attention_heads, cfg.num_key_value_heads, head_dim(cfg), ctx.args.block_size, ctx.dtype, ctx.device
    )


def run_kernels(ctx: Ctx, results: dict[str, Any]) -> None:
    from tram.model.attention import triton_kernels as tk  # an ImportError is this section's error

    args, s = ctx.args, attn_shape(ctx)
    batches = parse_ints(args.kernel_batches)
    results["shape"] = {
        "num_heads": s.num_heads,
        "num_kv_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "block_size": s.block_size,
        "dtype": str(s.dtype).removeprefix("torch."),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    results["copy"] = measure_copy_bandwidth(s.device, args.copy_mib)
    bandwidth = results["copy"]["bandwidth_GBps"] * 1e9
    results["write_kv_cache"], results["decode"], results["prefill"] = [], [], []
    for num_tokens in (max(batches), args.prefill_len):
        log(f"kernels: write_kv_cache, {num_tokens} tokens")
        results["write_kv_cache"].append(write_kv_row(ctx, tk, s, num_tokens))
        ctx.save()
    for batch in batches:
        log(f"kernels: decode, batch {batch}, context {args.kernel_context}")
        results["decode"] += attention_rows(
            ctx, tk, s, "decode", batch, 1, args.kernel_context, parse_ints(args.kernel_splits), bandwidth
        )
        ctx.save()
    prefills = [
        ("prefill", args.prefill_len, args.prefill_len),
        ("chunk_after_prefix", args.chunk_len, args.chunk_prefix + args.chunk_len),
    ]
    for case, query_len, context in prefills:
        log(f"kernels: {case}, {query_len} query tokens, context {context}")
        results["prefill"] += attention_rows(ctx, tk, s, case, 1, query_len, context, [1], bandwidth)
        ctx.save()
    rows = results["write_kv_cache"] + results["decode"] + results["prefill"]
    results["all_correct"] = all(r["correct"] for r in rows)
