"""The blocks of one KV cache group, per request: what full attention and a sliding window each need.

`FullAttentionManager` keeps every block of a request's context. `SlidingWindowManager` keeps only
the blocks the next query can see: a query at position p attends to keys p - W + 1 .. p, so once a
request has computed c tokens, blocks wholly before c - W + 1 go back to the pool (cached blocks stay
findable by their hash until evicted) and the null block takes their place in the block table.

Prefix-cache hits differ too: full attention needs every block of the hit, a sliding window only the
blocks of the window before the first recomputed token. The coordinator (kv_cache_manager.py) asks
each group for the longest hit it can serve and settles on a length every group can.
"""

from __future__ import annotations

from tram.core.block_pool import BlockPool, KVCacheBlock


class FullAttentionManager:
    def __init__(self, pool: BlockPool, block_size: int, group_id: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.group_id = group_id
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading blocks of each request already offered to the prefix cache (per-step work stays
        # proportional to new blocks, not to context length).
        self.num_hashed_blocks: dict[str, int] = {}

    def cache_key(self, block_hash: int) -> int:
        """Each group's copy of a prefix is its own cache entry (group 0 keeps the plain hash)."""
        return block_hash if self.group_id == 0 else hash((block_hash, self.group_id))

    # ---- prefix cache hits ---------------------------------------------------------------------
    def longest_hit(self, hashes: list[int], max_blocks: int) -> int:
        """The most leading blocks (<= max_blocks) whose content this group has cached."""
        n = 0
        while n < max_blocks and self.pool.get_cached_block(self.cache_key(hashes[n])) is not None:
            n += 1
        return n

    def hit_blocks(self, hashes: list[int], num_blocks: int) -> list[KVCacheBlock]:
        """The cached blocks of a hit of num_blocks blocks (a length longest_hit accepted)."""
        found = [self.pool.get_cached_block(self.cache_key(h)) for h in hashes[:num_blocks]]
        assert all(b is not None for b in found), "a hit shorter than longest_hit found"
        return found  # type: ignore[return-value]

    def shared_blocks(self, source_blocks: list[KVCacheBlock], num_blocks: int) -> list[KVCacheBlock] | None:
        """A sibling's first num_blocks blocks, if they are all still held."""
        return source_blocks[:num_blocks]

    # ---- allocation ---------------------------------------------------------------------------
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Full attention never skips a block."""

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int, computed: list[KVCacheBlock]) -> int:
        held = self.req_blocks.get(request_id, ())
        return max(0, -(-num_tokens // self.block_size) - len(held) - len(computed))

    def take_hits(self, request_id: str, computed: list[KVCacheBlock]) -> None:
        """Reference the hit blocks. Every group takes its hits before any group takes new blocks,
        so no group evicts a cached block another group is about to reference."""
        self.pool.touch(computed)
        self.req_blocks.setdefault(request_id, []).extend(computed)

    def allocate_new(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """New blocks up to num_tokens slots (the caller checked the pool)."""
        held = self.req_blocks.setdefault(request_id, [])
        new_blocks = self.pool.get_new_blocks(max(0, -(-num_tokens // self.block_size) - len(held)))
        held.extend(new_blocks)
        return new_blocks

    def cache_full_blocks(self, request_id: str, hashes: list[int], num_full_blocks: int) -> None:
        held = self.req_blocks.get(request_id, [])
        start = self.num_hashed_blocks.get(request_id, 0)
        for i in range(start, num_full_blocks):
            block = held[i]
            if block is not self.pool.null_block and block.block_hash is None:
                self.pool.cache_block(block, self.cache_key(hashes[i]))
        self.num_hashed_blocks[request_id] = max(start, num_full_blocks)

    def free(self, request_id: str) -> None:
        """Drop the request's references, tail first: its shared prefix outlives its tail in the cache."""
        blocks = self.req_blocks.pop(request_id, [])
        self.num_hashed_blocks.pop(request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def forget_if_empty(self, request_id: str) -> None:
        if not self.req_blocks.get(request_id, True):
            del self.req_blocks[request_id]


class SlidingWindowManager(FullAttentionManager):
    def __init__(self, pool: BlockPool, block_size: int, group_id: int, window: int) -> None:
        super().__init__(pool, block_size, group_id)
        assert pool.null_block is not None, "a sliding-window group needs the pool's null block"
        self.null_block: KVCacheBlock = pool.null_block
        self.window = window
        self.num_skipped: dict[str, int] = {}  # leading blocks of each request already nulled

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """The first block a query at position num_computed_tokens (or later) can see."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def longest_hit(self, hashes: list[int], max_blocks: int) -> int:
        """The longest n <= max_blocks whose window before token n * block_size is all cached."""
        n = max_blocks
        while n > 0:
            missing = self._last_missing(hashes, self.first_needed_block(n * self.block_size), n)
            if missing is None:
                return n
            n = missing  # every longer hit up to n needs block `missing` too
        return 0

    def _last_missing(self, hashes: list[int], start: int, end: int) -> int | None:
        for i in range(end - 1, start - 1, -1):
            if self.pool.get_cached_block(self.cache_key(hashes[i])) is None:
                return i
        return None

    def hit_blocks(self, hashes: list[int], num_blocks: int) -> list[KVCacheBlock]:
        start = min(self.first_needed_block(num_blocks * self.block_size), num_blocks)
        return [self.null_block] * start + super().hit_blocks(hashes[start:], num_blocks - start)

    def shared_blocks(self, source_blocks: list[KVCacheBlock], num_blocks: int) -> list[KVCacheBlock] | None:
        start = min(self.first_needed_block(num_blocks * self.block_size), num_blocks)
        window = source_blocks[start:num_blocks]
        if any(b is self.null_block for b in window):
            return None  # the sibling has moved on and freed part of this window
        return [self.null_block] * start + window

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        held = self.req_blocks.get(request_id)
        if not held:
            return
        start = self.num_skipped.get(request_id, 0)
        end = min(self.first_needed_block(num_computed_tokens), len(held))
        freed = [b for b in held[start:end] if b is not self.null_block]
        held[start:end] = [self.null_block] * max(0, end - start)
        self.pool.free_blocks(freed)  # oldest first: they are evicted first
        self.num_skipped[request_id] = max(start, end)

    def free(self, request_id: str) -> None:
        self.num_skipped.pop(request_id, None)
        super().free(request_id)
