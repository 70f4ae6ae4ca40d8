"""Configuration the core needs: pure Python so the scheduler stays torch-free."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CacheConfig:
    """Shape of the paged KV cache as the block pool sees it."""

    block_size: int = 16
    num_blocks: int = 0  # set once the worker has sized the cache
    enable_prefix_caching: bool = True


@dataclass
class SchedulerConfig:
    """Per-step limits of the iteration-level scheduler."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    max_model_len: int = 2048
