"""Block pool, KV cache manager and scheduler, without a model: any sequence of add / step / abort
leaves no leaked block, and the invariants hold after every operation."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tram.config import CacheConfig, SchedulerConfig
from tram.core.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from tram.core.kv_cache_manager import KVCacheManager
from tram.core.request import Request, RequestStatus
from tram.core.sched_output import ModelRunnerOutput
from tram.core.scheduler import Scheduler
from tram.sampling_params import SamplingParams

EOS = 2


def make_request(rid: str, prompt: list[int], max_tokens: int = 8, max_model_len: int = 256, **kw) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw), [EOS], max_model_len)


def fake_step(sched: Scheduler, rng: random.Random, vocab: int = 50, spec: bool = False) -> set[str]:
    """One step with a fake model: every request whose chunk reaches its last token samples one;
    with `spec`, a drafted request keeps a random number of its drafts (and one token more), and every
    request that sampled gets 0-4 random drafts for its next step."""
    out = sched.schedule()
    sampled, drafts_out = {}, {}
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        drafts = out.scheduled_spec_decode_tokens.get(rid, [])
        assert req.num_computed_tokens <= req.num_tokens + len(drafts)
        assert len(sched.kv_cache_manager.groups[0].req_blocks[rid]) * sched.block_size >= req.num_computed_tokens
        if req.num_computed_tokens == req.num_tokens + len(drafts):
            kept = drafts[: rng.randint(0, len(drafts))]
            sampled[rid] = kept + [rng.randrange(3, vocab) if rng.random() > 0.05 else EOS]
            if spec:
                drafts_out[rid] = [rng.randrange(3, vocab) for _ in range(rng.randint(0, 4))]
    assert out.total_num_scheduled_tokens <= sched.config.max_num_batched_tokens
    assert len(sched.running) <= sched.config.max_num_seqs
    res = sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled, spec_token_ids=drafts_out))
    for req in sched.requests.values():  # rejected drafts leave no computed count behind
        assert req.num_computed_tokens <= req.num_tokens
        assert len(req.block_hashes) <= req.num_tokens // sched.block_size
    return {o.request_id for o in res.outputs if o.finished}


# ---- free queue and pool ---------------------------------------------------------------------


def test_free_queue_removes_from_the_middle_in_constant_time_order_kept():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    q.remove(blocks[0])
    assert [b.block_id for b in q] == [1, 3, 4]
    q.append(blocks[2])
    assert q.popleft().block_id == 1
    assert [b.block_id for b in q] == [3, 4, 2]
    assert q.num_free_blocks == 3


def test_cached_blocks_are_evicted_in_lru_order():
    pool = BlockPool(4, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, 111)
    pool.cache_block(b, 222)
    pool.free_blocks([b, a])  # b freed first -> evicted first
    counts = pool.check_integrity()
    assert counts == {"free": 2, "cached": 2, "in_use": 0}
    got = pool.get_new_blocks(3)  # two never-used blocks first, then the least recently freed
    assert b in got and a not in got
    assert pool.get_cached_block(222) is None and pool.get_cached_block(111) is a
    pool.free_blocks(got)
    pool.check_integrity()


def test_prefix_hit_takes_reference_and_leaves_last_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    prompt = list(range(10, 22))  # 12 tokens = 3 full blocks
    r1 = make_request("a", prompt)
    blocks, n = kv.get_computed_blocks(r1)
    assert (blocks, n) == ([[]], 0)
    assert kv.allocate_slots(r1, 12) is not None
    r2 = make_request("b", prompt + [5])
    blocks, n = kv.get_computed_blocks(r2)
    assert n == 12 and len(blocks[0]) == 3
    r3 = make_request("c", list(prompt))
    _, n3 = kv.get_computed_blocks(r3)
    assert n3 == 8, "an exact repeat recomputes its last block so it has logits"
    assert kv.allocate_slots(r2, 1, blocks) is not None
    assert all(b.ref_cnt == 2 for b in blocks[0])
    kv.free(r1)
    kv.free(r2)
    counts = kv.check_integrity()
    assert counts["in_use"] == 0 and counts["cached"] == 3


def test_allocate_slots_returns_none_and_changes_nothing_when_full():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    r1 = make_request("a", list(range(8)))
    assert kv.allocate_slots(r1, 8) is not None
    r2 = make_request("b", list(range(100, 108)))
    before = kv.check_integrity()
    assert kv.allocate_slots(r2, 8) is None
    assert kv.check_integrity() == before
    assert "b" not in kv.groups[0].req_blocks


# ---- scheduler ---------------------------------------------------------------------------


def test_chunked_prefill_never_starves_running_decodes():
    sched = Scheduler(SchedulerConfig(8, 16, 256), CacheConfig(4, 64, True))
    sched.add_request(make_request("short", [3, 4, 5], max_tokens=20))
    fake_step(sched, random.Random(0))
    sched.add_request(make_request("long", list(range(3, 63)), max_tokens=4))
    out = sched.schedule()
    assert out.num_scheduled_tokens["short"] == 1
    assert out.num_scheduled_tokens["long"] == 15, "the long prompt takes what is left of the budget"
    assert list(out.num_scheduled_tokens) == ["short", "long"]


def test_preemption_frees_newest_and_requeues_it_at_the_front():
    sched = Scheduler(SchedulerConfig(8, 64, 24), CacheConfig(4, 6, True))  # capacity == max_model_len
    rng = random.Random(1)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", [3 + i] * 7, max_tokens=40, max_model_len=24, ignore_eos=True))
    seen_preempt = False
    for _ in range(200):
        fake_step(sched, rng)
        sched.kv_cache_manager.check_integrity()
        if sched.num_preemptions and not seen_preempt:
            seen_preempt = True
            assert sched.waiting[0].status == RequestStatus.PREEMPTED
            assert sched.waiting[0].num_computed_tokens == 0
        if not sched.has_unfinished_requests():
            break
    assert seen_preempt
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.check_integrity()["in_use"] == 0


def test_n_siblings_share_the_prompt_blocks():
    sched = Scheduler(SchedulerConfig(8, 64, 256), CacheConfig(4, 64, False))
    prompt = list(range(3, 20))  # 17 tokens: 4 full blocks
    leader = make_request("0_x", prompt)
    follower = Request("1_x", prompt, SamplingParams(max_tokens=8), [EOS], 256, prefix_source=leader)
    sched.add_request(leader)
    sched.add_request(follower)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["0_x"], "the sibling waits for the shared prompt"
    sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"0_x": [7]}))
    out = sched.schedule()
    assert out.num_scheduled_tokens["1_x"] == 1, "only the tail of the prompt is recomputed"
    shared = sched.kv_cache_manager.groups[0].req_blocks["0_x"][:4]
    assert sched.kv_cache_manager.groups[0].req_blocks["1_x"][:4] == shared
    assert all(b.ref_cnt == 2 for b in shared)
    sched.finish_requests(["0_x", "1_x"], RequestStatus.FINISHED_ABORTED)
    assert sched.kv_cache_manager.check_integrity()["in_use"] == 0


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 12), st.integers(0, 3)),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("abort"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(
    ops=ops,
    num_blocks=st.integers(11, 40),
    block_size=st.sampled_from([1, 2, 4, 16]),
    budget=st.integers(8, 64),
    max_seqs=st.integers(1, 6),
    caching=st.booleans(),
    seed=st.integers(0, 2**16),
    spec=st.booleans(),
    lookahead=st.sampled_from([0, 3]),
)
def test_any_add_step_abort_sequence_leaks_no_block(
    ops, num_blocks, block_size, budget, max_seqs, caching, seed, spec, lookahead
):
    """Speculative decoding's drafts and rolled-back counts included (`spec`), and a draft model's
    lookahead slots (`lookahead`)."""
    max_model_len = min(num_blocks * block_size, 64)
    sched = Scheduler(
        SchedulerConfig(max_seqs, budget, max_model_len, lookahead), CacheConfig(block_size, num_blocks, caching)
    )
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 50) for _ in range(40)] for _ in range(4)]
    counter = 0
    for op in ops:
        if op[0] == "add":
            _, plen, max_tokens, prefix = op
            prompt = prefixes[prefix][: min(plen, max_model_len)]
            sched.add_request(make_request(f"r{counter}", prompt, max_tokens, max_model_len))
            counter += 1
        elif op[0] == "step":
            for _ in range(op[1]):
                fake_step(sched, rng, spec=spec)
        else:
            live = list(sched.requests)
            if live:
                sched.finish_requests([live[op[1] % len(live)]], RequestStatus.FINISHED_ABORTED)
        sched.kv_cache_manager.check_integrity()
    for _ in range(2000):  # drain: everything must finish
        if not sched.has_unfinished_requests():
            break
        fake_step(sched, rng, spec=spec)
        sched.kv_cache_manager.check_integrity()
    assert not sched.has_unfinished_requests()
    counts = sched.kv_cache_manager.check_integrity()
    assert counts["in_use"] == 0
    assert sched.kv_cache_manager.pool.num_free_blocks == num_blocks
    assert not sched.kv_cache_manager.groups[0].req_blocks


def test_lookahead_slots_cover_a_draft_models_proposals_up_to_the_context():
    """A step that samples gets blocks for num_lookahead_tokens slots past its tokens, never past
    max_model_len; a prompt chunk that does not reach the end gets none."""
    sched = Scheduler(SchedulerConfig(4, 16, 40, num_lookahead_tokens=4), CacheConfig(4, 64, False))
    sched.add_request(make_request("whole", list(range(3, 13)), 30, 40))  # 10 tokens: 14 slots, 4 blocks
    sched.add_request(make_request("chunked", list(range(3, 23)), 30, 40))  # 20 tokens; 6 fit the budget
    sched.schedule()
    blocks = sched.kv_cache_manager.get_block_ids
    assert len(blocks("whole")[0]) == 4 and len(blocks("chunked")[0]) == 2
    sched = Scheduler(SchedulerConfig(4, 64, 40, num_lookahead_tokens=4), CacheConfig(4, 64, False))
    sched.add_request(make_request("edge", list(range(3, 41)), 30, 40))  # 38 tokens: 40 slots at most
    sched.schedule()
    assert len(sched.kv_cache_manager.get_block_ids("edge")[0]) == 10


def test_core_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, tram.core.scheduler, tram.core.kv_cache_manager; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_stop_and_mask_ids_follow_vllm():
    p = SamplingParams(stop_token_ids=[10], min_tokens=2)
    req = Request("a", [5], p, [2, 1], 64)
    assert req.eos_token_id == 2 and req.stop_token_ids == {10, 1}  # BOS-as-eos reports its id
    assert req.min_tokens_masked_ids == {10, 2, 1}
    q = Request("b", [5], SamplingParams(stop_token_ids=[10], min_tokens=2, ignore_eos=True), [2, 1], 64)
    assert q.eos_token_id is None and q.stop_token_ids == {10}
    assert q.min_tokens_masked_ids == {10, 2, 1}, "min_tokens masks eos even with ignore_eos"
    for tok in (7, 2):  # below min_tokens nothing stops; then the tokenizer's eos stops
        req.append_output_token(tok)
    assert req.check_stop() is not None and req.stop_reason is None
