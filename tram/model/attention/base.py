"""The seam between the model runner and attention kernels.

The runner builds one `AttentionMetadata` per step for a flattened variable-length batch:
request i owns query tokens [query_start_loc[i], query_start_loc[i+1]) of the step; its context
(cached prefix + this step's tokens) is seq_lens[i] tokens long, stored in the blocks listed in
block_tables[i]. Query tokens of a request are the last query_len positions of its context, so
token j of request i sits at absolute position seq_lens[i] - query_len_i + j and attends causally
to every context position <= its own.

KV cache layout, one tensor per layer: [2, num_blocks, block_size, num_kv_heads, head_dim]
(index 0 = keys, 1 = values). A token's slot is block_id * block_size + offset. The cache holds the
model's dtype, or fp8 (kv_quant.py): keys stored as k / k_scale, read back as stored * k_scale
(values with v_scale); backends ignore the scales for any other cache dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class AttentionMetadata:
    num_tokens: int  # T: tokens in the flattened batch
    slot_mapping: torch.Tensor  # [T] int64, where each new token's K/V goes
    query_start_loc: torch.Tensor  # [B+1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [B] int32, context length including this step's tokens
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32, padded with 0
    # Host-side copies so CPU backends can plan without device syncs.
    query_lens_list: list[int]
    seq_lens_list: list[int]
    max_query_len: int
    max_seq_len: int
    # Set when the batch is padded for a CUDA graph: the host lists then describe only the real
    # requests, while kernels must see the padded count; and the split count is fixed per graph.
    num_padded_reqs: int | None = None
    num_splits: int | None = None
    # A backend's own per-step plan, made by the first layer that needs it and read by the others
    # (the runner builds fresh metadata every step, so a plan never outlives its step).
    plan: Any = None
    # With more than one KV cache group (a hybrid cache: tram/core/kv_cache_groups.py), every
    # group's own metadata, index 0 being this one: the same requests and lengths, each group's
    # block tables and slot mapping. Empty: every layer uses this metadata.
    groups: tuple[AttentionMetadata, ...] = ()

    def for_group(self, group: int) -> AttentionMetadata:
        """The metadata of the layers in KV cache group `group`."""
        return self.groups[group] if self.groups else self

    @property
    def num_reqs(self) -> int:
        return self.num_padded_reqs if self.num_padded_reqs is not None else len(self.seq_lens_list)


class AttentionBackend(Protocol):
    """Writes the step's new K/V into the paged cache, then attends over the cache."""

    name: str

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
        logits_soft_cap: float | None = None,  # scores -> cap * tanh(score / cap) before mask and softmax
        # [num_heads] float32: per head, a logit that joins the softmax's denominator and adds no value
        # (gpt-oss's attention sinks: softmax over [scores, sink], the sink's column then dropped)
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        ...
