"""Paged attention in plain PyTorch: correct everywhere, fast enough on CPU and as a GPU fallback.

A step's flattened batch is split on the host (from meta's host lists, so no device syncs) into
  * decodes (query_len == 1): on CPU, the C++ kernel of cpu_kernels.py reads K/V straight from the
    paged cache; elsewhere (or with TRAM_CPU_KERNELS=0) one batched SDPA over K/V
    gathered through their block tables, padded to the longest context and masked by seq_len;
  * prefill chunks (query_len > 1): on CPU (head_dim % 16 == 0), one call of the C++ kernel for all
    of them, reading cached prefix and chunk from the paged cache; elsewhere one SDPA per request
    with an offset-causal mask over cached prefix + chunk (a plain causal SDPA on the step's own K/V
    when there is no prefix).
The split and the masks are planned once per step and reused by every layer.

Soft-capped scores (Gemma 2: cap * tanh(score / cap) before the mask and softmax) and attention sinks
(gpt-oss: a logit per head in the softmax's denominator) go through the C++ kernels as parameters;
SDPA has neither, so its paths then write the scores out (`_explicit_attention`), in float32 as the
kernels compute them.

An fp8 cache (kv_quant.py) is written quantized; the C++ kernels widen its bytes as they read them,
and the PyTorch paths dequantize what they gather to the query's dtype. A prefill then reads its own
chunk back from the cache too, so every path attends over the same (rounded) keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tram.model.attention.base import AttentionMetadata
from tram.model.attention.kv_quant import dequantize_kv, is_fp8, quantize_kv
from tram.model.kernels.cpu_kernels import SUPPORTED_DTYPES as _CPU_KERNEL_DTYPES
from tram.model.kernels.cpu_kernels import (
    kernels_for,
    load_cpu_kernels,
    paged_decode_attention,
    paged_prefill_attention_,
)


def _sdpa_supports_gqa() -> bool:
    """enable_gqa arrived in torch 2.5; older versions get K/V heads repeated instead."""
    q, kv = torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 1, 1)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


_SDPA_HAS_GQA = _sdpa_supports_gqa()

TokenIndex = slice | torch.Tensor
KVScales = tuple[float, float]  # (k_scale, v_scale) of an fp8 cache


@dataclass
class _Prefill:
    """One request with query_len > 1: tokens [start, end) of the step, context seq_len long."""

    start: int
    end: int
    seq_len: int
    block_table: torch.Tensor  # [max_blocks_per_seq], this request's row of meta.block_tables
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)  # by sliding window

    @property
    def query_len(self) -> int:
        return self.end - self.start


@dataclass
class _StepPlan:
    """How one step's batch is attended; built once, shared by all layers of the step."""

    num_real_tokens: int
    decode_tokens: TokenIndex | None  # rows of the batch that are decodes
    decode_block_tables: torch.Tensor | None  # [Bd, blocks covering the longest decode context]
    decode_seq_lens: torch.Tensor | None  # [Bd]
    decode_max_len: int
    prefills: list[_Prefill]
    prefill_reqs: list[int] = field(default_factory=list)  # their rows in meta.block_tables
    decode_masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # by sliding window
    # The CPU prefill kernel's request arguments (block tables, starts, query lens, seq lens).
    cpu_prefill_args: tuple[torch.Tensor, list[int], list[int], list[int]] | None = None


def _as_index(indices: list[int], device: torch.device) -> TokenIndex:
    """A slice when indices are a contiguous run (a view, no host->device copy), else an index tensor."""
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return slice(indices[0], indices[0] + len(indices))
    return torch.tensor(indices, dtype=torch.long, device=device)


def _plan(meta: AttentionMetadata, block_size: int, device: torch.device) -> _StepPlan:
    decode_reqs: list[int] = []
    decode_tokens: list[int] = []
    prefills: list[_Prefill] = []
    prefill_reqs: list[int] = []
    start = 0
    for req, (q_len, seq_len) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
        if q_len == 1:
            decode_reqs.append(req)
            decode_tokens.append(start)
        elif q_len > 1:
            prefills.append(_Prefill(start, start + q_len, seq_len, meta.block_tables[req]))
            prefill_reqs.append(req)
        start += q_len
    plan = _StepPlan(start, None, None, None, 0, prefills, prefill_reqs)
    if decode_reqs:
        max_len = max(meta.seq_lens_list[r] for r in decode_reqs)
        num_blocks = -(-max_len // block_size)
        reqs = _as_index(decode_reqs, device)
        plan.decode_tokens = _as_index(decode_tokens, device)
        plan.decode_block_tables = meta.block_tables[reqs, :num_blocks]  # [Bd, nblk]
        plan.decode_seq_lens = meta.seq_lens[reqs].to(torch.long)  # [Bd]
        plan.decode_max_len = num_blocks * block_size
    return plan


def _window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """True where a query at q_pos may see a key at k_pos: causal, and within the window if any."""
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window  # the window counts the token itself
    return mask


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, causal: bool = False
) -> torch.Tensor:
    """q [..., H, L, D], k/v [..., Hkv, S, D]; K/V heads are shared by H // Hkv query heads."""
    if q.dim() == 3:
        # PyTorch's CPU flash-attention kernel takes only 4-D inputs; 3-D ones fall back to the math
        # path, which materialises the [H, L, S] scores.
        mask = mask.unsqueeze(0) if mask is not None and mask.dim() == 3 else mask
        return _sdpa(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask, scale, causal).squeeze(0)
    groups = q.shape[-3] // k.shape[-3]
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    soft_cap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked attention (q [..., H, L, D], k/v [..., Hkv, S, D], boolean mask [..., 1, L, S] or [L, S]):
    SDPA, or the explicit scores path when a soft-cap or sinks (float32, broadcast to [H, L, 1]) are set."""
    if soft_cap is None and sinks is None:
        return _sdpa(q, k, v, mask, scale)
    return _explicit_attention(q, k, v, mask, scale, soft_cap, sinks)


def _explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    soft_cap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention with the scores written out, in transformers' order (scale, cap, mask, softmax over the
    scores and the sink, whose column is then dropped), the scores and softmax in float32. Shapes as
    `_attend`'s; -> [..., H, L, D]."""
    *batch, num_heads, q_len, head_dim = q.shape
    num_kv_heads = k.shape[-3]
    # Query heads grouped under the K/V head they share: no repeated K/V.
    q = q.reshape(*batch, num_kv_heads, num_heads // num_kv_heads, q_len, head_dim)  # [..., Hkv, G, L, D]
    k, v = k.unsqueeze(-3), v.unsqueeze(-3)  # [..., Hkv, 1, S, D]
    if mask.dim() >= 3:
        mask = mask.unsqueeze(-3)  # [..., 1, 1, L, S]: its head axis is 1, now the group axis too
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [..., Hkv, G, L, S]
    if soft_cap is not None:
        scores = torch.tanh(scores / soft_cap) * soft_cap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().expand(num_heads, q_len, 1).reshape(num_kv_heads, -1, q_len, 1)  # [Hkv, G, L, 1]
        probs = torch.softmax(torch.cat((scores, sink.expand(*scores.shape[:-1], 1)), dim=-1), dim=-1)[..., :-1]
    out = torch.matmul(probs.to(v.dtype), v)  # [..., Hkv, G, L, D]
    return out.reshape(*batch, num_heads, q_len, head_dim)


class TorchAttentionBackend:
    """AttentionBackend in pure PyTorch (see base.py for the metadata and cache layout contract)."""

    name = "torch"

    def forward(
        self,
        query: torch.Tensor,  # [T, num_heads, head_dim]
        key: torch.Tensor,  # [T, num_kv_heads, head_dim]
        value: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        block_size = kv_cache.shape[2]
        plan = self._get_plan(meta, block_size, query.device)
        n = plan.num_real_tokens  # rows past n are batch padding (e.g. graph capture sizes)
        scales = (k_scale, v_scale)
        cap = logits_soft_cap
        sinks = None if sinks is None else sinks.detach().float()
        write_kv_cache(key[:n], value[:n], kv_cache, meta.slot_mapping[:n], scales)
        if n < query.shape[0]:
            out = torch.zeros(query.shape, dtype=query.dtype, device=query.device)
        elif not plan.prefills and plan.decode_tokens is not None:  # decode-only step: no scatter into an output buffer
            return self._decode(query, kv_cache, plan, scale, sliding_window, scales, cap, sinks)
        else:
            out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if plan.decode_tokens is not None:
            out[plan.decode_tokens] = self._decode(
                query[plan.decode_tokens], kv_cache, plan, scale, sliding_window, scales, cap, sinks
            )
        if plan.prefills and query.shape[-1] % 16 == 0 and kernels_for(query) is not None:
            self._cpu_prefills(out, query, kv_cache, meta, plan, scale, sliding_window, scales, cap, sinks)
            return out
        for pre in plan.prefills:
            out[pre.start : pre.end] = self._prefill(
                query, key, value, kv_cache, pre, scale, sliding_window, scales, cap, sinks
            )
        return out

    def decode_only_plan(self, meta: AttentionMetadata, kv_cache: torch.Tensor, num_tokens: int) -> _StepPlan | None:
        """The step's plan where all num_tokens rows are decodes with no padding (None otherwise): what
        `decode_only` takes, decided before a layer starts (layers/cpu_decode.py)."""
        plan = self._get_plan(meta, kv_cache.shape[2], kv_cache.device)
        if plan.prefills or plan.decode_tokens is None or plan.num_real_tokens != num_tokens:
            return None
        return plan if meta.slot_mapping.shape[0] == num_tokens else None

    def decode_only(
        self,
        q: torch.Tensor,  # [T, H, D], T == plan's decodes
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        plan: _StepPlan,
        args: tuple[float, int, float, float, float],  # scale, sliding window (0: none), k/v scales, cap (0: none)
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """`forward` of a decode-only step on the CPU kernels, its arguments converted once per layer; the
        same calls and so the same bits."""
        write_kv_cache(k, v, kv_cache, meta.slot_mapping, (args[2], args[3]))  # the cache's one writer
        sinks = None if sinks is None else sinks.detach().to(torch.float32).contiguous()
        return load_cpu_kernels().paged_decode_attention(
            q, kv_cache, plan.decode_block_tables, plan.decode_seq_lens, *args, sinks
        )

    @staticmethod
    def _cpu_prefills(
        out: torch.Tensor,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        plan: _StepPlan,
        scale: float,
        sliding_window: int | None,
        scales: KVScales = (1.0, 1.0),
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Every prefill chunk of the step in one C++ call (csrc/paged_prefill.cpp), K/V read from the cache."""
        if plan.cpu_prefill_args is None:  # once per step, not per layer
            pres = plan.prefills
            tables = meta.block_tables[_as_index(plan.prefill_reqs, query.device)].to(torch.int32)
            plan.cpu_prefill_args = (
                tables,
                [p.start for p in pres],
                [p.query_len for p in pres],
                [p.seq_len for p in pres],
            )
        paged_prefill_attention_(
            out, query, kv_cache, *plan.cpu_prefill_args, scale, sliding_window, *scales, logits_soft_cap, sinks
        )

    @staticmethod
    def _get_plan(meta: AttentionMetadata, block_size: int, device: torch.device) -> _StepPlan:
        """Every layer of a step gets the same metadata, so the first one plans for all of them."""
        if not isinstance(meta.plan, _StepPlan):
            meta.plan = _plan(meta, block_size, device)
        return meta.plan

    def _decode(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        plan: _StepPlan,
        scale: float,
        sliding_window: int | None,
        scales: KVScales = (1.0, 1.0),
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [Bd, H, D] -> [Bd, H, D]: the C++ kernel on CPU, else `_decode_sdpa`."""
        if query.device.type == "cpu" and query.dtype in _CPU_KERNEL_DTYPES and load_cpu_kernels() is not None:
            # K/V read straight from the paged cache: no padded gather, no mask (csrc/paged_decode.cpp).
            return paged_decode_attention(
                query,
                kv_cache,
                plan.decode_block_tables,
                plan.decode_seq_lens,
                scale,
                sliding_window,
                *scales,
                logits_soft_cap,
                sinks,
            )
        return self._decode_sdpa(query, kv_cache, plan, scale, sliding_window, scales, logits_soft_cap, sinks)

    @staticmethod
    def _decode_sdpa(
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        plan: _StepPlan,
        scale: float,
        sliding_window: int | None,
        scales: KVScales = (1.0, 1.0),
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The PyTorch path of `_decode`: K/V gathered through the block tables, padded and masked."""
        num_kv_heads, head_dim = kv_cache.shape[-2:]
        bd, num_heads = query.shape[0], query.shape[1]
        groups = num_heads // num_kv_heads
        tables = plan.decode_block_tables
        length = plan.decode_max_len
        k, v = (_read(kv_cache[i][tables], query.dtype, scales[i]) for i in (0, 1))  # [Bd, nblk, bs, Hkv, D]
        k = k.view(bd, length, num_kv_heads, head_dim).transpose(1, 2)  # [Bd, Hkv, L, D]
        v = v.view(bd, length, num_kv_heads, head_dim).transpose(1, 2)  # [Bd, Hkv, L, D]
        mask = plan.decode_masks.get(sliding_window)
        if mask is None:
            q_pos = (plan.decode_seq_lens - 1).view(bd, 1, 1, 1)
            k_pos = torch.arange(length, device=query.device).view(1, 1, 1, length)
            mask = _window_mask(q_pos, k_pos, sliding_window)  # [Bd, 1, 1, L]
            plan.decode_masks[sliding_window] = mask
        # A decode has one query token, so the query heads sharing a K/V head can stand in the
        # sequence axis: attention is then per K/V head and K/V are never repeated.
        q = query.view(bd, num_kv_heads, groups, head_dim)  # [Bd, Hkv, G, D]
        sinks = None if sinks is None else sinks.view(num_kv_heads, groups, 1)  # heads laid out as q's
        out = _attend(q, k, v, mask, scale, logits_soft_cap, sinks)  # [Bd, Hkv, G, D]
        return out.reshape(bd, num_heads, head_dim)

    def _prefill(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        pre: _Prefill,
        scale: float,
        sliding_window: int | None,
        scales: KVScales = (1.0, 1.0),
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One request's chunk: -> [q_len, H, D]."""
        q = query[pre.start : pre.end].transpose(0, 1)  # [H, q_len, D]
        if pre.seq_len == pre.query_len and not is_fp8(kv_cache.dtype):
            # No cached prefix: the step's own K/V are the whole context, no gather needed.
            k = key[pre.start : pre.end].transpose(0, 1)  # [Hkv, q_len, D]
            v = value[pre.start : pre.end].transpose(0, 1)  # [Hkv, q_len, D]
            if sliding_window is None and logits_soft_cap is None and sinks is None:
                return _sdpa(q, k, v, None, scale, causal=True).transpose(0, 1)
        else:
            k, v = _gather_context(kv_cache, pre, query.dtype, scales)  # [Hkv, seq_len, D] each
        mask = pre.masks.get(sliding_window)
        if mask is None:
            device = query.device
            q_pos = torch.arange(pre.seq_len - pre.query_len, pre.seq_len, device=device).view(-1, 1)
            k_pos = torch.arange(pre.seq_len, device=device).view(1, -1)
            mask = _window_mask(q_pos, k_pos, sliding_window)  # [q_len, seq_len]
            pre.masks[sliding_window] = mask
        sinks = None if sinks is None else sinks.view(-1, 1, 1)  # [H, 1, 1]
        return _attend(q, k, v, mask, scale, logits_soft_cap, sinks).transpose(0, 1)


def _gather_context(
    kv_cache: torch.Tensor, pre: _Prefill, dtype: torch.dtype, scales: KVScales = (1.0, 1.0)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The request's first seq_len cached keys and values as `dtype`, each [Hkv, seq_len, D]."""
    block_size, num_kv_heads, head_dim = kv_cache.shape[2:]
    num_blocks = -(-pre.seq_len // block_size)
    blocks = pre.block_table[:num_blocks]
    k = kv_cache[0][blocks].view(-1, num_kv_heads, head_dim)[: pre.seq_len]  # [seq_len, Hkv, D]
    v = kv_cache[1][blocks].view(-1, num_kv_heads, head_dim)[: pre.seq_len]  # [seq_len, Hkv, D]
    return _read(k, dtype, scales[0]).transpose(0, 1), _read(v, dtype, scales[1]).transpose(0, 1)


def _read(cached: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Gathered cache rows as the compute dtype: fp8 dequantized, anything else as it is."""
    return dequantize_kv(cached, dtype, scale) if is_fp8(cached.dtype) else cached


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scales: KVScales = (1.0, 1.0),
) -> None:
    """Scatter key/value [T, Hkv, D] into their slots of kv_cache [2, num_blocks, block_size, Hkv, D]
    (quantized with scales = (k_scale, v_scale) when the cache is fp8)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kernels = kernels_for(key) if key.dtype == kv_cache.dtype and kv_cache.is_contiguous() else None
    if kernels is not None and key.stride()[1:] == value.stride()[1:] == (head_dim, 1):
        kernels.write_kv_cache_(kv_cache, key, value, slot_mapping)  # one call where this is half a dozen ops
        return
    if is_fp8(kv_cache.dtype):
        key, value = quantize_kv(key, kv_cache.dtype, scales[0]), quantize_kv(value, kv_cache.dtype, scales[1])
    kv_cache[0].view(-1, num_kv_heads, head_dim)[slot_mapping] = key  # slots: [num_blocks*block_size, Hkv, D]
    kv_cache[1].view(-1, num_kv_heads, head_dim)[slot_mapping] = value
