"""The KV cache manager: which blocks each request holds, and the prefix cache on top of the pool.

Contract:
- `allocate_slots(request, n)` answers "can this request get n more token slots?" with the newly
  allocated blocks of each KV cache group (possibly empty) or None, in which case nothing the
  scheduler can observe changed. The scheduler reacts (waits or preempts).
- KV cache groups (kv_cache_groups.py): one per kind of attention layer (in the hybrid layout,
  several of a kind), each with its own block table per request and its own manager
  (single_type_manager.py), all drawing on one block pool.
- Prefix caching: every full block of a request is hashed (chained on its parent block's hash) as soon
  as its token ids are known and it is scheduled to be filled; a later request with the same prefix
  takes references on those blocks instead of recomputing them. A hit is the longest prefix every
  group can serve (a sliding-window group needs only its window). At least one prompt token is always
  recomputed so the request has logits to sample from.
- `free(request)` drops the request's references, tail blocks first, so the least useful blocks of
  a finished request are evicted before its shared prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

from tram.core.block_pool import BlockPool, KVCacheBlock
from tram.core.request import Request
from tram.core.single_type_manager import FullAttentionManager, SlidingWindowManager

# Per KV cache group, a request's blocks (or ids) in position order.
GroupBlocks = list[list[KVCacheBlock]]


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        group_windows: Sequence[int | None] = (None,),
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        sliding = any(w is not None for w in group_windows)
        self.pool = BlockPool(num_blocks, enable_caching, reserve_null_block=sliding)
        self.groups: list[FullAttentionManager] = [
            FullAttentionManager(self.pool, block_size, g)
            if window is None
            else SlidingWindowManager(self.pool, block_size, g, window)
            for g, window in enumerate(group_windows)
        ]
        # Prefix-cache statistics in tokens, cumulative; the engine turns them into rates.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def usage(self) -> float:
        return self.pool.usage()

    def empty_blocks(self) -> GroupBlocks:
        return [[] for _ in self.groups]

    def _update_block_hashes(self, request: Request) -> list[int]:
        """Extend the request's chained hashes to cover all of its full blocks."""
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, tuple(tokens[i * bs : (i + 1) * bs])))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        """Longest cached prefix of the request, per group, and its length in tokens; nothing is
        reserved yet."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return self.empty_blocks(), 0  # prompt logprobs need logits at every prompt position
        hashes = self._update_block_hashes(request)
        # Leave at least one token to compute so there are logits to sample from.
        n = (request.num_tokens - 1) // self.block_size
        while True:  # shrinks until every group serves the same length (a window may need fewer)
            shortest = min(group.longest_hit(hashes, n) for group in self.groups)
            if shortest == n:
                break
            n = shortest
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += n * self.block_size
        return [group.hit_blocks(hashes, n) for group in self.groups], n * self.block_size

    def get_shared_prefix_blocks(self, request: Request, source: Request) -> tuple[GroupBlocks, int]:
        """Full prompt blocks of a sibling (n > 1) that this request can share; nothing reserved yet."""
        src = [group.req_blocks.get(source.request_id, []) for group in self.groups]
        computed_full = source.num_computed_tokens // self.block_size
        n = min(min(len(b) for b in src), computed_full, (request.num_tokens - 1) // self.block_size)
        if request.all_token_ids[: n * self.block_size] != source.all_token_ids[: n * self.block_size]:
            return self.empty_blocks(), 0
        shared = [group.shared_blocks(blocks, n) for group, blocks in zip(self.groups, src)]
        if any(blocks is None for blocks in shared):
            return self.empty_blocks(), 0
        return shared, n * self.block_size  # type: ignore[return-value]

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: GroupBlocks | None = None,
        num_lookahead_tokens: int = 0,
    ) -> GroupBlocks | None:
        """Reserve room for `num_new_tokens` more tokens after the computed ones (and any new
        computed blocks), and `num_lookahead_tokens` slots past them (a draft model's proposals);
        return the newly allocated blocks per group, or None if the pool cannot serve it. Blocks a
        sliding window no longer sees go back to the pool first."""
        computed = new_computed_blocks or self.empty_blocks()
        rid = request.request_id
        for group in self.groups:
            group.remove_skipped_blocks(rid, request.num_computed_tokens)
        total_tokens = request.num_computed_tokens + len(computed[0]) * self.block_size + num_new_tokens
        slots = total_tokens + num_lookahead_tokens
        num_new_blocks = sum(
            group.num_blocks_to_allocate(rid, slots, blocks) for group, blocks in zip(self.groups, computed)
        )
        # Hit blocks sitting in the free queue stop being allocatable once we reference them.
        hits = {b.block_id: b for blocks in computed for b in blocks if b is not self.pool.null_block}
        num_evictable_hits = sum(1 for b in hits.values() if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_evictable_hits:
            for group in self.groups:
                group.forget_if_empty(rid)
            return None
        for group, blocks in zip(self.groups, computed):
            group.take_hits(rid, blocks)
        new_blocks = [group.allocate_new(rid, slots) for group in self.groups]
        if self.enable_caching:
            num_full = min(total_tokens, request.num_tokens) // self.block_size
            if num_full:
                hashes = self._update_block_hashes(request)
                for group in self.groups:
                    group.cache_full_blocks(rid, hashes, num_full)
        return new_blocks

    def free(self, request: Request) -> None:
        for group in self.groups:
            group.free(request.request_id)

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        return [[b.block_id for b in group.req_blocks.get(request_id, [])] for group in self.groups]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> dict[str, int]:
        """Pool invariants plus: every reference is held by exactly one request's block list, and
        every block by one group."""
        counts = self.pool.check_integrity()
        refs: dict[int, int] = {}
        owner: dict[int, int] = {}  # a block holds one group's layers: no two groups share it
        for g, group in enumerate(self.groups):
            for blocks in group.req_blocks.values():
                for b in blocks:
                    if b is not self.pool.null_block:
                        refs[b.block_id] = refs.get(b.block_id, 0) + 1
                        assert owner.setdefault(b.block_id, g) == g, (
                            f"{b} is held by groups {owner[b.block_id]} and {g}"
                        )
        for block in self.pool.blocks:
            assert block.ref_cnt == refs.get(block.block_id, 0), (
                f"{block} has ref_cnt {block.ref_cnt} but {refs.get(block.block_id, 0)} holders"
            )
        return counts
