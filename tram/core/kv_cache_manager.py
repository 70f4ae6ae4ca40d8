"""The KV cache manager: which blocks each request holds, and the prefix cache on top of the pool.

Contract:
- `allocate_slots(request, n)` answers "can this request get n more token slots?" with the newly
  allocated blocks (possibly empty) or None, in which case nothing changed. The scheduler reacts
  (waits or preempts).
- Prefix caching: every full block of a request is hashed (chained on its parent block's hash) as soon
  as its token ids are known and it is scheduled to be filled; a later request with the same prefix
  takes references on those blocks instead of recomputing them. At least one prompt token is always
  recomputed so the request has logits to sample from.
- `free(request)` drops the request's references, tail blocks first, so the least useful blocks of
  a finished request are evicted before its shared prefix.
"""

from __future__ import annotations

from tram.core.block_pool import BlockPool, KVCacheBlock
from tram.core.request import Request


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request were already offered to the cache (keeps
        # per-step work proportional to new blocks, not to context length).
        self.num_hashed_blocks: dict[str, int] = {}
        # Prefix-cache statistics in tokens, cumulative; the engine turns them into rates.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def _update_block_hashes(self, request: Request) -> list[int]:
        """Extend the request's chained hashes to cover all of its full blocks."""
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, tuple(tokens[i * bs : (i + 1) * bs])))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of the request, in blocks and tokens; nothing is reserved yet."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0  # prompt logprobs need logits at every prompt position
        hashes = self._update_block_hashes(request)
        # Leave at least one token to compute so there are logits to sample from.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit: list[KVCacheBlock] = []
        for h in hashes[:max_blocks]:
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            hit.append(block)
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += len(hit) * self.block_size
        return hit, len(hit) * self.block_size

    def get_shared_prefix_blocks(self, request: Request, source: Request) -> tuple[list[KVCacheBlock], int]:
        """Full prompt blocks of a sibling (n > 1) that this request can share; nothing reserved yet."""
        src_blocks = self.req_blocks.get(source.request_id, [])
        computed_full = source.num_computed_tokens // self.block_size
        n = min(len(src_blocks), computed_full, (request.num_tokens - 1) // self.block_size)
        if request.all_token_ids[: n * self.block_size] != source.all_token_ids[: n * self.block_size]:
            return [], 0
        return src_blocks[:n], n * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Reserve room for `num_new_tokens` more tokens after the computed ones (and any new
        computed blocks); return the newly allocated blocks, or None if the pool cannot serve it."""
        computed = new_computed_blocks or []
        held = self.req_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed) * self.block_size
        total_tokens = num_computed + num_new_tokens
        num_required = -(-total_tokens // self.block_size)
        num_new_blocks = max(0, num_required - len(held) - len(computed))
        # Hit blocks sitting in the free queue stop being allocatable once we reference them.
        num_evictable_hits = sum(1 for b in computed if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_evictable_hits:
            if not held:
                del self.req_blocks[request.request_id]
            return None
        self.pool.touch(computed)
        held.extend(computed)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        held.extend(new_blocks)
        if self.enable_caching:
            self._cache_full_blocks(request, held, min(total_tokens, request.num_tokens))
        return new_blocks

    def _cache_full_blocks(self, request: Request, held: list[KVCacheBlock], num_tokens: int) -> None:
        start = self.num_hashed_blocks.get(request.request_id, 0)
        end = num_tokens // self.block_size
        if end <= start:
            return
        hashes = self._update_block_hashes(request)
        for i in range(start, end):
            if held[i].block_hash is None:
                self.pool.cache_block(held[i], hashes[i])
        self.num_hashed_blocks[request.request_id] = end

    def free(self, request: Request) -> None:
        blocks = self.req_blocks.pop(request.request_id, [])
        self.num_hashed_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> dict[str, int]:
        """Pool invariants plus: every reference is held by exactly one request's block list."""
        counts = self.pool.check_integrity()
        refs: dict[int, int] = {}
        for blocks in self.req_blocks.values():
            for b in blocks:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
        for block in self.pool.blocks:
            assert block.ref_cnt == refs.get(block.block_id, 0), (
                f"{block} has ref_cnt {block.ref_cnt} but {refs.get(block.block_id, 0)} holders"
            )
        return counts
