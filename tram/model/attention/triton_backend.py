"""Paged attention with Triton kernels: the default on CUDA.

Unlike the PyTorch backend it plans nothing on the host: every per-step quantity the kernels need
lives in device tensors, and the launch grids depend only on (tokens, requests, longest query,
splits). That is what lets a CUDA graph captured for a decode batch size replay any later decode
step of that size with other lengths and block tables.
"""

from __future__ import annotations

import torch

from tram.model.attention.base import AttentionMetadata

# Split-K (flash-decoding) pays off when a decode step has too few (request, kv head) pairs to fill
# the GPU and contexts are long enough to share out. These are starting points for tuning on an H100
# (132 SMs): aim for a few programs per SM, and give each split at least a few KV blocks of work.
_TARGET_PROGRAMS = 4 * 132
_MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 16


def choose_num_splits(num_reqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int) -> int:
    """How many ways to split each decode's context; 1 (no split) for steps with prefill tokens."""
    if max_query_len > 1:
        return 1
    programs = max(1, num_reqs * num_kv_heads)
    by_occupancy = -(-_TARGET_PROGRAMS // programs)
    by_length = max(1, max_seq_len // _MIN_TOKENS_PER_SPLIT)
    return max(1, min(MAX_SPLITS, by_occupancy, by_length))


class TritonAttentionBackend:
    name = "triton"

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
        from tram.model.attention.triton_kernels import paged_attention, write_kv_cache

        num_tokens = query.shape[0]
        write_kv_cache(key, value, kv_cache, meta.slot_mapping[:num_tokens], k_scale, v_scale)
        out = torch.empty_like(query)
        splits = meta.num_splits or choose_num_splits(meta.num_reqs, key.shape[1], meta.max_query_len, meta.max_seq_len)
        paged_attention(
            query,
            kv_cache,
            out,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            scale,
            num_reqs=meta.num_reqs,
            max_query_len=meta.max_query_len,
            sliding_window=sliding_window,
            num_splits=splits,
            k_scale=k_scale,
            v_scale=v_scale,
            logits_soft_cap=logits_soft_cap,
            sinks=sinks,
        )
        return out
