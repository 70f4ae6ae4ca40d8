"""The hybrid KV cache in the scheduler's terms: groups by attention kind, sliding-window groups that
give blocks back as they fall out of the window, prefix hits that need only the window, and a pool
whose accounting stays exact through random workloads with preemption."""

from __future__ import annotations

import random

from test_core_properties import fake_step, make_request

from tram.config import CacheConfig, SchedulerConfig
from tram.core.kv_cache_groups import blocks_per_request, plan_kv_cache_groups
from tram.core.kv_cache_manager import KVCacheManager
from tram.core.scheduler import Scheduler

GEMMA3_1B = [None if (i + 1) % 6 == 0 else 512 for i in range(26)]  # 5 local layers per global one


def test_gemma3_1b_layout_groups_layers_of_one_kind() -> None:
    layout = plan_kv_cache_groups(GEMMA3_1B)
    assert layout.num_slots == 4  # the 4 global layers set the group size
    assert layout.group_windows == (512,) * 6 + (None,)  # 22 sliding layers: 5 groups of 4 and one of 2
    for g in range(layout.num_groups):
        layers = [i for i, grp in enumerate(layout.layer_groups) if grp == g]
        assert {GEMMA3_1B[i] for i in layers} == {layout.group_windows[g]}
        assert sorted(layout.layer_slots[i] for i in layers) == list(range(len(layers)))
    assert plan_kv_cache_groups(GEMMA3_1B, hybrid=False).group_windows == (None,)
    assert plan_kv_cache_groups([8, 8, 8]).group_windows == (8,)  # Mistral: one sliding group


def test_a_32k_request_needs_a_sixth_of_the_full_cache() -> None:
    layout = plan_kv_cache_groups(GEMMA3_1B)
    hybrid = blocks_per_request(layout.group_windows, 32768, 16, 2048) * layout.num_slots
    full = blocks_per_request((None,), 32768, 16, 2048) * len(GEMMA3_1B)
    assert full / hybrid > 4


def _manager(num_blocks: int, windows: tuple[int | None, ...], block_size: int = 4) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, enable_caching=True, group_windows=windows)


def _advance(kv: KVCacheManager, req, n: int) -> None:  # noqa: ANN001 - a core Request
    assert kv.allocate_slots(req, n) is not None
    req.num_computed_tokens += n


def test_a_sliding_group_frees_what_the_window_has_passed() -> None:
    kv = _manager(64, (None, 6))
    req = make_request("a", list(range(3, 43)))  # 40 tokens, 10 blocks
    for _ in range(5):  # a chunked prefill of 8 tokens a step
        computed = req.num_computed_tokens
        _advance(kv, req, 8)
        full, sliding = kv.groups
        held = [b for b in sliding.req_blocks["a"] if b is not kv.pool.null_block]
        # This step's first query (at `computed`) sees 6 keys back: only blocks from there on stay.
        first = max(0, computed - 6 + 1) // 4
        assert held == sliding.req_blocks["a"][first:]
        assert len(full.req_blocks["a"]) == req.num_computed_tokens // 4
    # The last chunk (blocks 8, 9) began at position 32, whose query saw keys 27..32: blocks 6 and 7.
    assert kv.check_integrity()["in_use"] == 10 + 4
    kv.free(req)
    assert kv.check_integrity()["in_use"] == 0


def test_a_prefix_hit_needs_only_the_window_in_a_sliding_group() -> None:
    kv = _manager(64, (None, 6))
    prompt = list(range(3, 35))  # 32 tokens, 8 full blocks
    first = make_request("a", prompt)
    _advance(kv, first, 32)
    kv.free(first)
    second = make_request("b", prompt + [7])
    blocks, n = kv.get_computed_blocks(second)
    assert n == 32
    full, sliding = blocks
    assert len(full) == 8 and len(sliding) == 8
    # The query at position 32 sees keys 27..32: blocks 6 and 7; the rest are the null block.
    assert sliding[:6] == [kv.pool.null_block] * 6 and kv.pool.null_block not in sliding[6:]
    assert kv.allocate_slots(second, 1, blocks) is not None
    second.num_computed_tokens = 33
    assert kv.check_integrity()["in_use"] == (8 + 1) + (2 + 1)  # each group: its hit and a block for token 33
    kv.free(second)
    kv.check_integrity()


def test_a_hit_shrinks_to_what_every_group_still_has() -> None:
    kv = _manager(64, (None, 6))
    prompt = list(range(3, 35))
    first = make_request("a", prompt)
    _advance(kv, first, 32)
    kv.free(first)
    sliding = kv.groups[1]
    # Evict the sliding group's copy of blocks 6 and 7 (the window of a full-length hit).
    hashes = first.block_hashes
    for i in (6, 7):
        block = kv.pool.get_cached_block(sliding.cache_key(hashes[i]))
        kv.pool.free_queue.remove(block)
        kv.pool._evict(block)
        kv.pool.free_queue.append(block)
    _, n = kv.get_computed_blocks(make_request("b", prompt + [7]))
    assert n == 24  # blocks 4 and 5 hold the window of a 24-token hit
    kv.check_integrity()


def test_random_hybrid_workloads_keep_the_pool_exact() -> None:
    """Chunked prefills, decodes, prefix hits and preemptions on a pool too small for everyone."""
    preemptions = 0
    for seed in range(6):
        rng = random.Random(seed)
        cache = CacheConfig(block_size=4, num_blocks=40, enable_prefix_caching=True, group_windows=(None, 5, 5))
        sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=16, max_model_len=64), cache)
        prefix = [rng.randrange(3, 50) for _ in range(12)]
        for i in range(20):
            prompt = (prefix if rng.random() < 0.5 else []) + [
                rng.randrange(3, 50) for _ in range(rng.randrange(1, 20))
            ]
            sched.add_request(make_request(f"r{i}", prompt, max_tokens=rng.randrange(1, 12), max_model_len=64))
        for _ in range(400):
            if not sched.has_unfinished_requests():
                break
            fake_step(sched, rng)
            sched.kv_cache_manager.check_integrity()
        assert not sched.has_unfinished_requests()
        assert sched.kv_cache_manager.check_integrity()["in_use"] == 0
        preemptions += sched.num_preemptions
    assert preemptions > 0


def test_no_group_evicts_a_block_another_group_hits() -> None:
    """The free queue's head holds the second group's cached copy of a prefix: the first group's new
    block must not take it while the second group's hit still points at it."""
    kv = _manager(7, (None, 8))  # the null block and 6: 2 + 1 blocks in each of two groups
    first, other = make_request("a", list(range(3, 11))), make_request("c", list(range(20, 24)))
    for req in (first, other):
        _advance(kv, req, req.num_tokens)
    kv.free(first)
    kv.free(other)
    second = make_request("b", list(range(3, 11)) + [5])
    blocks, n = kv.get_computed_blocks(second)
    assert n == 8
    assert kv.allocate_slots(second, 1, blocks) is not None
    kv.check_integrity()  # every block held by one group only
    assert [b.block_id for b in kv.groups[1].req_blocks["b"][:2]] == [b.block_id for b in blocks[1]]
