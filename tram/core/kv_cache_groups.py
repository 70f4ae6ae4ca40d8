"""KV cache groups: which layers share a block table, and which cache tensor each layer writes.

A model whose layers all attend the same way (all full, or all with one sliding window) has one
group: every layer's cache tensor is indexed by the request's one block table, as always. A model
that mixes full and sliding-window layers (Gemma 2 and 3) keeps each kind in its own groups, so a
sliding group can drop the blocks that fall out of its window while a full group keeps them all.

The layout follows vLLM's hybrid allocator: every group has the same number of layers
(`group_size`, the smallest count of any kind), so a block of the one shared pool is the same bytes
whichever group holds it. The cache has `group_size` tensors ("slots"); the j-th layer of every
group writes slot j, at the block ids of its own group. A kind whose count is not a multiple of
group_size leaves the last group short (its unused slots waste that group's share).

Pure data, no torch: the engine's scheduler and every worker compute the same layout from the
model's per-layer windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheLayout:
    group_windows: tuple[int | None, ...]  # per group: the sliding window, None for full attention
    layer_groups: tuple[int, ...]  # per layer (global index): its group
    layer_slots: tuple[int, ...]  # per layer: the cache tensor it writes
    num_slots: int  # cache tensors (layers per group)

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    @property
    def is_hybrid(self) -> bool:
        return self.num_groups > 1

    def slots_of(self, layers: Sequence[int]) -> list[int]:
        """The distinct slots these layers (a pipeline stage's) write, ascending."""
        return sorted({self.layer_slots[i] for i in layers})


def plan_kv_cache_groups(layer_windows: Sequence[int | None], hybrid: bool = True) -> KVCacheLayout:
    """The layout for a model whose layer i has sliding window layer_windows[i] (None: full).

    hybrid False (vLLM's --disable-hybrid-kv-cache-manager) keeps one group of every layer: with
    mixed kinds it holds the whole context for every layer (attention still applies each window).
    """
    n = len(layer_windows)
    if n == 0:
        raise ValueError("a model without attention layers has no KV cache to plan")
    kinds = list(dict.fromkeys(layer_windows))  # in order of first appearance
    if len(kinds) == 1 or not hybrid:
        window = kinds[0] if len(kinds) == 1 else None
        return KVCacheLayout((window,), (0,) * n, tuple(range(n)), n)
    layers_of = {kind: [i for i, w in enumerate(layer_windows) if w == kind] for kind in kinds}
    group_size = min(len(layers) for layers in layers_of.values())
    windows: list[int | None] = []
    groups = [0] * n
    slots = [0] * n
    for kind in kinds:
        layers = layers_of[kind]
        for start in range(0, len(layers), group_size):
            for slot, layer in enumerate(layers[start : start + group_size]):
                groups[layer], slots[layer] = len(windows), slot
            windows.append(kind)
    return KVCacheLayout(tuple(windows), tuple(groups), tuple(slots), group_size)


def blocks_per_request(
    group_windows: Sequence[int | None], num_tokens: int, block_size: int, max_chunk_tokens: int
) -> int:
    """The most pool blocks one request of num_tokens tokens holds at once, prefilled in chunks of
    up to max_chunk_tokens: a full group holds its whole context; a sliding group the blocks of
    its window before the chunk plus the chunk's own."""
    context = -(-num_tokens // block_size)
    total = 0
    for window in group_windows:
        if window is None:
            total += context
        else:
            total += min(context, -(-(window - 1 + max_chunk_tokens) // block_size) + 1)
    return total
