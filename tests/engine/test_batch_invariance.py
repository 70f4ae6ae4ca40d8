"""Continuous batching, chunked prefill, preemption and prefix caching never change a request's output."""

from __future__ import annotations

import random

import pytest
from api_helpers import assert_no_leak, run_staggered

from tram import LLM, SamplingParams

NUM_REQS = 8
MAX_LEN = 128  # the same context limit everywhere, so length stops agree


def make_prompts(llm: LLM, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    texts = ["Once upon a time", "Tom and his dog", "The sun was", "Lily wanted to", "A big red ball"]
    tok = llm.get_tokenizer()
    prompts = []
    for i in range(NUM_REQS):
        ids = tok.encode(texts[i % len(texts)])
        # Vary lengths so chunks and blocks end in different places.
        prompts.append(ids + [rng.randrange(3, 512) for _ in range(rng.randrange(0, 45))])
    return prompts


def run_alone(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    outs = []
    for p, sp in zip(prompts, params):
        out = llm.generate({"prompt_token_ids": p}, sp, use_tqdm=False)[0]
        outs.append(out.outputs[0].token_ids)
    return outs


def greedy_params(n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=40 + 7 * i, ignore_eos=True) for i in range(n)]


def seeded_params(n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=40, ignore_eos=True) for i in range(n)]


@pytest.fixture(scope="module")
def reference(stories_path):
    """Each request generated alone, with a budget large enough that nothing is chunked."""
    llm = LLM(
        stories_path, max_model_len=MAX_LEN, max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=False
    )
    prompts = make_prompts(llm)
    greedy = run_alone(llm, prompts, greedy_params(NUM_REQS))
    seeded = run_alone(llm, prompts, seeded_params(NUM_REQS))
    assert_no_leak(llm.llm_engine)
    return prompts, greedy, seeded


@pytest.mark.parametrize("every", [0, 3])
def test_staggered_arrivals_with_chunked_prefill(stories_path, reference, every):
    prompts, greedy, seeded = reference
    llm = LLM(
        stories_path, max_model_len=MAX_LEN, max_num_seqs=16, max_num_batched_tokens=16
    )  # prompts of up to 50 tokens get chunked
    engine = llm.llm_engine
    assert run_staggered(engine, prompts, greedy_params(NUM_REQS), every) == greedy
    assert run_staggered(engine, prompts, seeded_params(NUM_REQS), every) == seeded


def test_preemption_by_recompute_keeps_outputs(stories_path, reference):
    prompts, greedy, seeded = reference
    # 8 blocks of 16 = 128 tokens: one request fits at full length, eight at once do not.
    llm = LLM(stories_path, max_model_len=MAX_LEN, num_gpu_blocks_override=8, max_num_batched_tokens=32)
    engine = llm.llm_engine
    assert run_staggered(engine, prompts, greedy_params(NUM_REQS), 1) == greedy
    assert engine.get_stats().num_preemptions > 0
    before = engine.get_stats().num_preemptions
    assert run_staggered(engine, prompts, seeded_params(NUM_REQS), 0) == seeded
    assert engine.get_stats().num_preemptions > before


def test_prefix_caching_keeps_outputs_and_hits(stories_path, reference):
    prompts, greedy, _ = reference
    llm = LLM(stories_path, max_model_len=MAX_LEN, max_num_seqs=16, max_num_batched_tokens=64)
    engine = llm.llm_engine
    # Every prompt twice: the second copy finds the first one's blocks.
    doubled = prompts + prompts
    params = greedy_params(NUM_REQS) * 2
    assert run_staggered(engine, doubled, params, 2) == greedy + greedy
    stats = engine.get_stats()
    assert stats.prefix_cache_hits > 0 and stats.prefix_cache_queries >= stats.prefix_cache_hits


def test_shared_long_prefix_reports_cached_tokens(llm):
    tok = llm.get_tokenizer()
    prefix = tok.encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.")
    params = SamplingParams(temperature=0, max_tokens=24)
    first = llm.generate({"prompt_token_ids": prefix + [300]}, params, use_tqdm=False)[0]
    second = llm.generate({"prompt_token_ids": prefix + [301]}, params, use_tqdm=False)[0]
    assert second.num_cached_tokens >= 16 * (len(prefix) // 16) > 0
    fresh = LLM(llm.llm_engine.config.model_config.model, enable_prefix_caching=False, max_num_seqs=4)
    expect = fresh.generate({"prompt_token_ids": prefix + [301]}, params, use_tqdm=False)[0]
    assert second.outputs[0].token_ids == expect.outputs[0].token_ids
    assert expect.num_cached_tokens == 0 and first.outputs[0].token_ids
    assert_no_leak(fresh.llm_engine)


def test_seeded_request_is_independent_of_its_neighbours(llm):
    target = SamplingParams(temperature=1.0, seed=7, max_tokens=32, ignore_eos=True)
    alone = llm.generate("Once upon a time", target, use_tqdm=False)[0].outputs[0].token_ids
    noise = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True)
    prompts = ["Tom and his dog", "Once upon a time", "The sun was", "Lily wanted to"]
    outs = llm.generate(prompts, [noise, target, noise, noise], use_tqdm=False)
    assert outs[1].outputs[0].token_ids == alone
    other_seed = llm.generate(
        "Once upon a time", SamplingParams(temperature=1.0, seed=8, max_tokens=32, ignore_eos=True), use_tqdm=False
    )
    assert other_seed[0].outputs[0].token_ids != alone


def test_n_samples_share_prompt_blocks_and_are_reproducible(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=16, ignore_eos=True)
    prompt = "Once upon a time, there was a little girl named Lily. She loved to play"
    a = llm.generate(prompt, params, use_tqdm=False)[0]
    b = llm.generate(prompt, params, use_tqdm=False)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2, 3]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1, "samples with distinct seeds should differ"
    # Step by step: once every sample runs, all four hold the same prompt blocks.
    engine = llm.llm_engine
    assert engine.engine_core.reset_prefix_cache(), "no block may be in use between workloads"
    engine.add_request("shared", prompt, params)
    kv = engine.engine_core.scheduler.kv_cache_manager
    sample_ids = [f"{i}_shared" for i in range(4)]
    for _ in range(4):
        engine.step()
    num_full = len(a.prompt_token_ids) // 16
    assert num_full >= 1
    firsts = [kv.groups[0].req_blocks[sid][:num_full] for sid in sample_ids]
    assert all(blocks == firsts[0] for blocks in firsts)
    assert all(b.ref_cnt == 4 for b in firsts[0])
    while engine.has_unfinished_requests():
        engine.step()
