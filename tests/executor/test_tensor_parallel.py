"""Tensor parallelism on CPU, for real: a worker process per rank (the `mp` executor), gloo
collectives, greedy output identical to transformers and logprobs within float tolerance; chunked
prefill, prefix caching, preemption and n > 1 unchanged; KV accounting clean after each workload."""

from __future__ import annotations

import random

import pytest
from conftest import STORIES_EOS, assert_no_leak, hf_greedy, hf_logprobs
from hf_models import make_hf_model_dir

from tram import LLM, SamplingParams
from tram.bench.truncated_draft import write_truncated_draft

PROMPTS = ["Once upon a time", "Tom and his dog", "The little bird", "Lily wanted to", "One day, a big"]
MAX_LEN = 128


@pytest.fixture(scope="module")
def tp_llm(stories_path: str) -> LLM:
    # A 16-token budget chunks every prompt longer than that over several steps.
    llm = LLM(stories_path, tensor_parallel_size=2, max_num_seqs=16, max_model_len=MAX_LEN, max_num_batched_tokens=16)
    yield llm
    procs = list(llm.llm_engine.engine_core.executor._procs)
    llm.llm_engine.engine_core.shutdown()
    assert all(proc.poll() is not None for proc in procs)  # shutdown leaves no worker behind
    llm.llm_engine.engine_core.shutdown()  # and twice is harmless


@pytest.fixture(scope="module")
def one_rank(stories_path: str) -> LLM:
    return LLM(stories_path, max_num_seqs=16, max_model_len=MAX_LEN)


@pytest.fixture
def tp(tp_llm: LLM) -> LLM:
    yield tp_llm
    assert_no_leak(tp_llm.llm_engine)


def test_runs_one_process_per_rank(tp: LLM):
    executor = tp.llm_engine.engine_core.executor
    assert executor.world_size == 2
    assert all(proc.poll() is None for proc in executor._procs)
    # Each rank holds half the KV heads (stories260K: 4), so a block is half as large.
    assert executor.collective_rpc("bytes_per_block") == [executor.bytes_per_block()] * 2


def test_greedy_matches_transformers(tp: LLM, stories_path: str):
    outs = tp.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    for out in outs:
        expected = hf_greedy(stories_path, out.prompt_token_ids, 64, STORIES_EOS)
        assert out.outputs[0].token_ids == expected, out.prompt


def test_logprobs_match_transformers(tp: LLM, stories_path: str):
    params = SamplingParams(temperature=0, max_tokens=20, logprobs=5, prompt_logprobs=3)
    out = tp.generate("Tom and his dog", params, use_tqdm=False)[0]
    comp = out.outputs[0]
    ref = hf_logprobs(stories_path, out.prompt_token_ids + comp.token_ids)
    p = len(out.prompt_token_ids)
    for i, (tok, row) in enumerate(zip(comp.token_ids, comp.logprobs)):
        for tid, lp in row.items():
            assert lp.logprob == pytest.approx(ref[p - 1 + i, tid].item(), abs=1e-4)
        assert row[tok].rank == 1
    for j in range(1, p):
        tok = out.prompt_token_ids[j]
        assert out.prompt_logprobs[j][tok].logprob == pytest.approx(ref[j - 1, tok].item(), abs=1e-4)


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 512) for _ in range(rng.randrange(5, 60))] for _ in range(count)]


def test_batching_chunking_and_seeded_sampling_match_one_rank(tp: LLM, one_rank: LLM):
    prompts = [{"prompt_token_ids": p} for p in _prompts(0, 8)]
    params = [
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=30, ignore_eos=True),
    ]
    for sp in params:
        ours = [o.outputs[0].token_ids for o in tp.generate(prompts, sp, use_tqdm=False)]
        alone = [o.outputs[0].token_ids for o in one_rank.generate(prompts, sp, use_tqdm=False)]
        assert ours == alone
    assert_no_leak(one_rank.llm_engine)


def test_parallel_sampling_n_matches_one_rank(tp: LLM, one_rank: LLM):
    sp = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=20, ignore_eos=True)
    ours = tp.generate("Once upon a time", sp, use_tqdm=False)[0]
    alone = one_rank.generate("Once upon a time", sp, use_tqdm=False)[0]
    assert [c.token_ids for c in ours.outputs] == [c.token_ids for c in alone.outputs]
    assert len({tuple(c.token_ids) for c in ours.outputs}) > 1


def test_prefix_cache_hit_keeps_output(tp: LLM):
    prompt = {"prompt_token_ids": _prompts(3, 1)[0] + list(range(100, 140))}
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    first = tp.generate(prompt, sp, use_tqdm=False)[0]
    second = tp.generate(prompt, sp, use_tqdm=False)[0]
    assert second.num_cached_tokens > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_preemption_keeps_outputs(stories_path: str, one_rank: LLM):
    # 12 blocks of 16 tokens for 8 requests of up to ~90 tokens: requests get preempted and recomputed.
    llm = LLM(
        stories_path,
        tensor_parallel_size=2,
        max_num_seqs=8,
        max_model_len=MAX_LEN,
        num_gpu_blocks_override=12,
        enable_prefix_caching=False,
    )
    try:
        prompts = [{"prompt_token_ids": p} for p in _prompts(5, 8)]
        sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        ours = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        assert llm.llm_engine.get_stats().num_preemptions > 0
        alone = [o.outputs[0].token_ids for o in one_rank.generate(prompts, sp, use_tqdm=False)]
        assert ours == alone
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize(
    "kind,tp_size,overrides",
    [
        ("llama_untied", 2, {}),  # biases on q/k/v, o_proj and the MLP; an untied LM head
        ("qwen3", 2, {}),  # per-head q/k norms
        ("gemma3_softcap", 2, {}),  # scaled embeddings, soft-capped logits
        # 4 ranks over 2 KV heads (each replicated twice), and a vocabulary of 510 in shards of 128.
        ("llama_gqa", 4, {"vocab_size": 510}),
    ],
)
def test_random_models_greedy_match_transformers(tmp_path, kind: str, tp_size: int, overrides: dict):
    path = make_hf_model_dir(tmp_path, kind, **overrides)
    rng = random.Random(kind)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 40))] for _ in range(3)]
    llm = LLM(path, tensor_parallel_size=tp_size, max_num_seqs=8, max_num_batched_tokens=32, max_model_len=128)
    try:
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for prompt, out in zip(prompts, outs):
            comp = out.outputs[0]
            assert comp.token_ids == hf_greedy(path, prompt, 16, None), f"{kind}: {prompt}"
            ref = hf_logprobs(path, prompt + comp.token_ids)
            for i, tok in enumerate(comp.token_ids):
                row = ref[len(prompt) - 1 + i]
                scale = max(1.0, row.abs().max().item())
                assert comp.logprobs[i][tok].logprob == pytest.approx(row[tok].item(), abs=2e-4 * scale)
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_one_rank_in_its_own_process_matches_in_process(stories_path: str, one_rank: LLM):
    # What a GPU user gets with --distributed-executor-backend mp and one device.
    llm = LLM(stories_path, distributed_executor_backend="mp", max_num_seqs=16, max_model_len=MAX_LEN)
    try:
        assert llm.llm_engine.engine_core.executor.world_size == 1
        sp = SamplingParams(temperature=0, max_tokens=24)
        ours = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp, use_tqdm=False)]
        assert ours == [o.outputs[0].token_ids for o in one_rank.generate(PROMPTS, sp, use_tqdm=False)]
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle3"])
def test_speculative_decoding_across_ranks(
    stories_path: str, one_rank: LLM, monkeypatch: pytest.MonkeyPatch, tmp_path, method: str
):
    """Every rank verifies the same drafts and keeps the same tokens: greedy output is one rank's. A
    draft model or an EAGLE-3 head (random weights: drafts that are verified, seldom accepted) is
    split over the ranks as its target is, its K/V beside the target's on each."""
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")  # drafts whatever the timing
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    if method == "draft_model":
        spec = {
            "method": method,
            "model": str(write_truncated_draft(stories_path, 4, tmp_path)),
            "num_speculative_tokens": 3,
        }
    llm = LLM(stories_path, tensor_parallel_size=2, max_num_seqs=16, max_model_len=MAX_LEN, speculative_config=spec)
    try:
        # A story the model told, then its opening again: the continuation retells it, so drafts hold.
        told = one_rank.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
        prompts = [{"prompt_token_ids": o.prompt_token_ids + o.outputs[0].token_ids + o.prompt_token_ids} for o in told]
        sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        ours = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        assert ours == [o.outputs[0].token_ids for o in one_rank.generate(prompts, sp, use_tqdm=False)]
        counts = llm.llm_engine.get_stats().spec_decoding
        assert (counts.num_draft_tokens if method == "eagle3" else counts.num_accepted_tokens) > 0
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()
