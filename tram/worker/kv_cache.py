"""The worker's paged KV cache: its layout over the model's layers, its tensors, and which layer
reads which block table.

The layout (tram/core/kv_cache_groups.py) comes from each layer's sliding window; the engine computes
the same one for its scheduler. This rank allocates one tensor per slot its pipeline stage's layers
write, [2, num_blocks, block_size, num_kv_heads, head_dim] each; layers of different groups at the
same slot share a tensor, at the disjoint block ids the pool gives their groups.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

import tram.envs as envs
from tram.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from tram.core.kv_cache_groups import KVCacheLayout, blocks_per_request, plan_kv_cache_groups
from tram.model.layers.attention import Attention
from tram.model.spec import layer_sliding_windows
from tram.worker.cpu_memory import lazy_zeros, mem_available

logger = logging.getLogger(__name__)


def effective_windows(hf_config: Any, max_model_len: int) -> list[int | None]:
    """Each layer's sliding window as the cache sees it: a window that covers the longest context
    (Phi-3-128k's 262144 over 131072 positions) keeps every block, so it is full attention."""
    windows = list(layer_sliding_windows(hf_config))  # checked at start (model/choices.py)
    return [w if w is not None and w < max_model_len else None for w in windows]


def kv_cache_layout(config: EngineConfig) -> KVCacheLayout:
    mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
    return plan_kv_cache_groups(effective_windows(mc.hf_config, sc.max_model_len), cc.hybrid_kv_cache)


def allocate_kv_caches(
    layout: KVCacheLayout,
    stage_layers: range,
    num_blocks: int,
    block_shape: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One cache tensor per local layer (layers of one slot share it). Zeros, not empty: attention
    reads masked slots and null-block slots, and 0 * NaN would poison outputs."""
    block_size, num_kv_heads, head_dim = block_shape
    shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    if device.type == "cpu":  # pages are taken as blocks are first written, not all at start
        slots = {s: lazy_zeros(shape, dtype) for s in layout.slots_of(stage_layers)}
    else:
        slots = {s: torch.zeros(shape, dtype=dtype, device=device) for s in layout.slots_of(stage_layers)}
    return [slots[layout.layer_slots[i]] for i in stage_layers]


def bind_kv_cache_groups(model: nn.Module, layout: KVCacheLayout, stage_layers: range) -> None:
    """Tell each local attention layer its KV cache group (the block table it reads)."""
    attention = [m for m in model.modules() if isinstance(m, Attention)]
    assert len(attention) == len(stage_layers), "one attention module per local decoder layer"
    for module, layer in zip(attention, stage_layers):
        module.kv_group = layout.layer_groups[layer]


def describe_layout(layout: KVCacheLayout) -> str:
    kinds = ["full" if w is None else f"window {w}" for w in layout.group_windows]
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    groups = ", ".join(f"{n} x {k}" for k, n in counts.items())
    return f"{layout.num_groups} KV cache groups ({groups}) of {layout.num_slots} layers each"


def cpu_kv_cache_budget(config: EngineConfig) -> tuple[int, str, bool]:
    """(bytes, where they came from, whether the user asked for them) of this rank's CPU KV cache:
    kv_cache_memory_bytes, else TRAM_CPU_KVCACHE_SPACE or VLLM_CPU_KVCACHE_SPACE (GiB; 0 is unset,
    as in vLLM), else the default."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes, "kv_cache_memory_bytes", True
    for name in ("TRAM_CPU_KVCACHE_SPACE", "VLLM_CPU_KVCACHE_SPACE"):
        gib = getattr(envs, name)
        if gib:
            if gib < 0:
                raise ValueError(f"{name}={gib}: the KV cache budget must be a positive number of GiB")
            return int(gib * 2**30), f"{name}={gib:g}", True
    return DEFAULT_CPU_KV_CACHE_BYTES, "the default", False


def cpu_kv_cache_blocks(config: EngineConfig, layout: KVCacheLayout, bytes_per_block: int) -> int:
    """The blocks of this rank's CPU KV cache: what max_num_seqs requests of max_model_len tokens can
    hold at once, capped by the budget. A budget the machine cannot hold is an error now, not an
    out-of-memory kill once requests fill it; the default shrinks to half the available memory."""
    cc, sc = config.cache_config, config.scheduler_config
    budget, source, asked = cpu_kv_cache_budget(config)
    available = mem_available()
    if available is not None and budget > available:
        if asked:
            raise ValueError(
                f"The KV cache budget of {budget / 2**30:.2f} GiB ({source}) is more than the "
                f"{available / 2**30:.2f} GiB of memory this machine has available; ask for less"
            )
        budget, source = available // 2, "half the available memory"
    per_request = blocks_per_request(layout.group_windows, sc.max_model_len, cc.block_size, sc.max_num_batched_tokens)
    useful = sc.max_num_seqs * per_request + any(w is not None for w in layout.group_windows)  # + null block
    num_blocks = max(1, min(budget // bytes_per_block, useful))
    if config.kv_cache_memory_bytes is not None:
        num_blocks = max(1, budget // bytes_per_block)  # an exact size, as vLLM's flag
    logger.info(
        "CPU KV cache: %d requests x %d tokens can use %d blocks (%.2f GiB); budget %.2f GiB (%s); "
        "%d blocks of %d bytes = %.2f GiB, mapped as they are first written",
        sc.max_num_seqs,
        sc.max_model_len,
        useful,
        useful * bytes_per_block / 2**30,
        budget / 2**30,
        source,
        num_blocks,
        bytes_per_block,
        num_blocks * bytes_per_block / 2**30,
    )
    return num_blocks
