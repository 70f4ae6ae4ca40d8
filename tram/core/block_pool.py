"""The block pool: fixed-size KV cache blocks, their reference counts, and the prefix cache index.

Contract:
- Every block is in exactly one of three states: *in use* (ref_cnt > 0, not in the free queue),
  *cached* (ref_cnt == 0, in the free queue, has a block hash and is findable through the cache
  index) or *free* (ref_cnt == 0, in the free queue, no hash).
- The free queue is ordered by eviction priority: the front is handed out first: blocks without a
  hash, then (least recently freed first) cached ones.
  Removing a cached block from the middle when it is hit again is O(1) (doubly linked list).
- A block hash identifies a full block's content: it chains the parent block's hash with the block's
  token ids, so equal hashes mean equal prefixes. Several blocks may hold one content (a request
  that could not use a hit computes it again): each is indexed, so evicting one keeps the others
  findable.
- With `reserve_null_block`, block 0 is the *null block*: never handed out, never freed, never
  written. A sliding-window group puts it where a block has fallen out of the window, so block
  tables keep indexing by position; attention never reads those positions' values into a result.
"""

from __future__ import annotations

from collections.abc import Iterable


class KVCacheBlock:
    """One block of `block_size` token slots; `prev`/`next` link it into the free queue."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev: KVCacheBlock | None = None
        self.next: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeBlockQueue:
    """Doubly linked list of blocks with ref_cnt 0, in LRU order, with O(1) removal anywhere."""

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)  # sentinels keep the link updates branch-free
        self._tail = KVCacheBlock(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next
        if block is self._tail or block is None:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        assert block.prev is not None and block.next is not None, "block is not in the free queue"
        block.prev.next = block.next
        block.next.prev = block.prev
        block.prev = block.next = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        self.num_free_blocks += 1

    def appendleft(self, block: KVCacheBlock) -> None:
        first = self._head.next
        assert first is not None
        self._head.next = block
        block.prev = self._head
        block.next = first
        first.prev = block
        self.num_free_blocks += 1

    def __iter__(self):
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node
            node = node.next


class BlockPool:
    """Owns every KV cache block; hands them out, takes them back, and indexes cached ones by hash."""

    def __init__(self, num_blocks: int, enable_caching: bool, reserve_null_block: bool = False) -> None:
        reserved = int(reserve_null_block)
        if num_blocks <= reserved:
            raise ValueError(f"the KV cache needs at least {reserved + 1} block(s), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block: KVCacheBlock | None = self.blocks[0] if reserve_null_block else None
        self.free_queue = FreeBlockQueue(self.blocks[reserved:])
        self.cached: dict[int, dict[int, KVCacheBlock]] = {}  # hash -> {block id: block}

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - (self.null_block is not None)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: truly free plus evictable cached ones."""
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        blocks = self.cached.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take another reference on blocks (a prefix-cache hit or a shared prefix); the null block
        takes none."""
        for block in blocks:
            if block is self.null_block:
                continue
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; cached blocks reaching zero join the queue's tail in the given
        order, blocks without a hash its head: they hold nothing worth keeping, and handing out a
        block written before (its pages mapped) keeps untouched cache memory unmapped."""
        for block in ordered:
            if block is self.null_block:
                continue
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"double free of {block}"
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def cache_block(self, block: KVCacheBlock, block_hash: int) -> None:
        """Register a full block under its hash (beside any other block of that content)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        self.cached.setdefault(block_hash, {})[block.block_id] = block

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            same = self.cached.get(block.block_hash, {})
            same.pop(block.block_id, None)
            if not same:
                self.cached.pop(block.block_hash, None)
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; only possible when no block is in use."""
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True

    def check_integrity(self) -> dict[str, int]:
        """Assert the pool's invariants; return the counts of free, cached and in-use blocks."""
        queued = list(self.free_queue)
        assert len(queued) == self.free_queue.num_free_blocks, "free queue length drifted"
        queued_ids = {b.block_id for b in queued}
        assert len(queued_ids) == len(queued), "a block is in the free queue twice"
        num_cached = num_free = num_used = 0
        for block in self.blocks:
            if block is self.null_block:
                assert block.ref_cnt == 0 and block.block_hash is None and block.block_id not in queued_ids
                continue
            assert block.ref_cnt >= 0, f"negative ref count: {block}"
            if block.ref_cnt > 0:
                assert block.block_id not in queued_ids, f"in-use block in the free queue: {block}"
                num_used += 1
            else:
                assert block.block_id in queued_ids, f"unreferenced block not in the free queue: {block}"
                if block.block_hash is not None:
                    num_cached += 1
                else:
                    num_free += 1
            if block.block_hash is not None:
                indexed = self.cached.get(block.block_hash, {}).get(block.block_id)
                assert indexed is block, f"hashed block not indexed: {block}"
        for h, same in self.cached.items():
            assert same, f"an empty index entry for {h}"
            for block in same.values():
                assert block.block_hash == h, f"cache index points at a block with another hash: {block}"
        assert num_free + num_cached + num_used == self.num_usable_blocks
        return {"free": num_free, "cached": num_cached, "in_use": num_used}
