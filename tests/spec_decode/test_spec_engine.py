"""Speculative decoding end to end on stories260K, with each proposer (n-gram; a draft model cut from
stories260K itself, tram/bench/truncated_draft.py): every request's output is the one the
same engine gives without speculation (itself held to transformers by tests/engine/test_oracle.py),
under continuous batching, staggered arrivals, chunked prefill, preemption, prefix caching, n > 1,
stops inside an accepted run and requests whose sampling features are never drafted (constrained
requests are: test_spec_grammar.py); the block pool is clean after each workload, and the drafts were
both accepted and rejected along the way."""

from __future__ import annotations

import pytest
from api_helpers import assert_no_leak, run_staggered
from conftest import STORIES

from tram import LLM, SamplingParams
from tram.bench.truncated_draft import write_truncated_draft

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
# The draft keeps 4 of the target's 5 layers: it accepts about a quarter of its drafts, rejecting the rest.
DRAFT_LAYERS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=80)


@pytest.fixture(scope="module", autouse=True)
def _drafts_whatever_the_timing():
    """Whether speculation pays at a batch size is measured (spec_decode/budget.py, tested on its own);
    a test that must see drafts verified cannot depend on timing."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
        yield


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_truncated_draft(STORIES, DRAFT_LAYERS, tmp_path_factory.mktemp("draft")))


@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def spec_config(request: pytest.FixtureRequest, draft_path: str) -> dict:
    if request.param == "ngram":
        return NGRAM
    return {"method": "draft_model", "model": draft_path, "num_speculative_tokens": 4}


@pytest.fixture(scope="module")
def spec_llm(_drafts_whatever_the_timing, spec_config: dict) -> LLM:
    llm = LLM(STORIES, max_num_seqs=64, speculative_config=spec_config)
    yield llm
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture
def spec(spec_llm: LLM):
    yield spec_llm
    assert_no_leak(spec_llm.llm_engine)


@pytest.fixture(scope="module")
def copy_prompts(stories_llm: LLM) -> list[str]:
    """Prompts whose continuations copy them: a story the model told, then its opening again; and
    a sentence said three times."""
    openings = ["Once upon a time", "Tom and his dog", "One day, a little bird", "Lily saw a big tree"]
    params = SamplingParams(temperature=0, max_tokens=90)
    stories = [o.outputs[0].text for o in stories_llm.generate(openings, params, use_tqdm=False)]
    told = [f"{start}{story}\n{start}" for start, story in zip(openings, stories)]
    return told + ["Tom had a big red ball. Tom had a big red ball. Tom had a big red ball. Tom"]


def _spec_counts(llm: LLM):
    return llm.llm_engine.get_stats().spec_decoding


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        for ox, oy in zip(x.outputs, y.outputs, strict=True):
            assert (ox.token_ids, ox.finish_reason, ox.text) == (oy.token_ids, oy.finish_reason, oy.text)


def test_greedy_output_is_unchanged_under_continuous_batching(llm, spec, copy_prompts):
    prompts = copy_prompts + ["The sun", "A cat sat on", "Sue liked to", "Max ran"]
    params = [SamplingParams(temperature=0, max_tokens=20 + 13 * i) for i in range(len(prompts))]
    before = _spec_counts(spec)
    got = spec.generate(prompts, params, use_tqdm=False)
    _same(got, llm.generate(prompts, params, use_tqdm=False))
    after = _spec_counts(spec)
    drafted = after.num_draft_tokens - (before.num_draft_tokens if before else 0)
    accepted = after.num_accepted_tokens - (before.num_accepted_tokens if before else 0)
    assert 0 < accepted < drafted, "the workload must both accept and reject drafts"
    produced = sum(len(o.outputs[0].token_ids) for o in got)
    verified = after.num_drafts - (before.num_drafts if before else 0)
    assert verified < produced, "accepted drafts must save steps"


def test_staggered_arrivals(llm, spec, copy_prompts):
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in copy_prompts] * 2
    params = [SamplingParams(temperature=0, max_tokens=30 + 7 * i) for i in range(len(prompts))]
    got = run_staggered(spec.llm_engine, prompts, params, every=3)
    assert got == run_staggered(llm.llm_engine, prompts, params, every=3)


def test_chunked_prefill_preemption_and_small_budget(llm, copy_prompts, spec_config):
    # Two sequences at a time in 32 blocks of 16 and 24 tokens a step: every prompt is chunked, the
    # drafts are cut to the budget, and two long requests preempt each other.
    small = LLM(
        STORIES,
        max_num_seqs=2,
        enable_prefix_caching=False,
        num_gpu_blocks_override=32,
        max_num_batched_tokens=24,
        speculative_config=spec_config,
    )
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    got = small.generate(copy_prompts, params, use_tqdm=False)
    _same(got, llm.generate(copy_prompts, params, use_tqdm=False))
    stats = small.llm_engine.get_stats()
    assert stats.num_preemptions > 0 and stats.spec_decoding.num_accepted_tokens > 0
    assert_no_leak(small.llm_engine)
    small.llm_engine.engine_core.shutdown()


def test_prefix_cache_hits_never_hold_unverified_tokens(llm, spec, copy_prompts):
    first = spec.generate(copy_prompts[1], GREEDY, use_tqdm=False)[0]
    # The second run finds the prompt (and only verified tokens) in the cache.
    again = spec.generate({"prompt_token_ids": first.prompt_token_ids + first.outputs[0].token_ids[:50]}, GREEDY)[0]
    assert again.num_cached_tokens >= 16 * ((len(first.prompt_token_ids) + 49) // 16) - 16
    plain = llm.generate({"prompt_token_ids": first.prompt_token_ids + first.outputs[0].token_ids[:50]}, GREEDY)[0]
    _same([first, again], [llm.generate(copy_prompts[1], GREEDY, use_tqdm=False)[0], plain])


def test_n_greater_than_one_and_seeded_sampling(llm, spec, copy_prompts):
    greedy_n = SamplingParams(temperature=0, max_tokens=60, n=2)
    got = spec.generate(copy_prompts[0], greedy_n, use_tqdm=False)[0]
    want = llm.generate(copy_prompts[0], SamplingParams(temperature=0, max_tokens=60), use_tqdm=False)[0]
    assert [o.token_ids for o in got.outputs] == [want.outputs[0].token_ids] * 2
    seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=60, n=3)
    got = spec.generate(copy_prompts[0], seeded, use_tqdm=False)[0]
    want = llm.generate(copy_prompts[0], seeded, use_tqdm=False)[0]
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]


def test_seeded_sampling_gives_the_tokens_plain_decoding_gives(llm, spec, copy_prompts):
    """Each position's token comes from its own noise (rejection_sampler.py), so a seeded request
    repeats plain decoding token for token, drafts accepted or not."""
    params = [
        SamplingParams(temperature=t, top_k=k, top_p=p, seed=s, max_tokens=70)
        for s, (t, k, p) in enumerate([(0.5, 0, 1.0), (1.0, 20, 1.0), (0.8, 0, 0.9), (1.2, 50, 0.95)])
    ]
    prompts = copy_prompts[: len(params)]
    before = _spec_counts(spec)
    _same(spec.generate(prompts, params, use_tqdm=False), llm.generate(prompts, params, use_tqdm=False))
    after = _spec_counts(spec)
    assert after.num_accepted_tokens > (before.num_accepted_tokens if before else 0)


def test_stops_inside_an_accepted_run(llm, spec, copy_prompts):
    story = llm.generate(copy_prompts[0], GREEDY, use_tqdm=False)[0].outputs[0]
    words = story.text.split()
    params = [
        SamplingParams(temperature=0, max_tokens=80, stop=[words[len(words) // 2]]),
        SamplingParams(temperature=0, max_tokens=80, stop=[words[5]], include_stop_str_in_output=True),
        SamplingParams(temperature=0, max_tokens=len(story.token_ids) // 2 + 1),
        SamplingParams(temperature=0, max_tokens=80, stop_token_ids=[story.token_ids[30]]),
    ]
    prompts = [copy_prompts[0]] * len(params)
    got = spec.generate(prompts, params, use_tqdm=False)
    _same(got, llm.generate(prompts, params, use_tqdm=False))
    assert got[0].outputs[0].finish_reason == "stop" and got[2].outputs[0].finish_reason == "length"


def test_requests_with_logits_processors_are_served_undrafted(llm, spec, copy_prompts):
    tok = llm.get_tokenizer()
    processed = [
        SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=40, frequency_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=40, min_tokens=40),  # drafted only past min_tokens
        SamplingParams(temperature=0, max_tokens=40, logit_bias={tok.encode(" ball")[-1]: -50.0}),
    ]
    prompt = copy_prompts[-1]
    before = _spec_counts(spec)
    got = spec.generate([prompt] * len(processed), processed, use_tqdm=False)
    assert _spec_counts(spec) == before, "a request a logits processor touches must not be drafted"
    _same(got, llm.generate([prompt] * len(processed), processed, use_tqdm=False))
    # The same prompt with plain greedy sampling beside them is drafted, and still unchanged.
    mixed = processed[:2] + [GREEDY]
    _same(spec.generate([prompt] * 3, mixed, use_tqdm=False), llm.generate([prompt] * 3, mixed, use_tqdm=False))
    assert _spec_counts(spec).num_accepted_tokens > (before.num_accepted_tokens if before else 0)


def test_logprobs_of_accepted_drafts_are_those_of_plain_decoding(llm, spec, copy_prompts):
    """A drafted request's logprobs come from the raw logits at each token's position, which the
    one-token verification queries compute with plain decoding's attention kernels (a step's GEMMs
    have more rows than plain decoding's, so its logits may differ in the last float bits)."""
    params = [
        SamplingParams(temperature=0, max_tokens=60, logprobs=3),
        SamplingParams(temperature=0.8, seed=3, max_tokens=60, logprobs=0),
        SamplingParams(temperature=0, max_tokens=60, logprobs=20, stop=[" the"]),
    ]
    prompts = copy_prompts[:3]
    before = _spec_counts(spec)
    got = spec.generate(prompts, params, use_tqdm=False)
    want = llm.generate(prompts, params, use_tqdm=False)
    _same(got, want)
    assert _spec_counts(spec).num_accepted_tokens > (before.num_accepted_tokens if before else 0)
    for g, w in zip(got, want):
        rows_g, rows_w = g.outputs[0].logprobs, w.outputs[0].logprobs
        assert len(rows_g) == len(rows_w) == len(g.outputs[0].token_ids)
        for row_g, row_w in zip(rows_g, rows_w):
            assert row_g.keys() == row_w.keys()
            for tok in row_g:
                assert row_g[tok].rank == row_w[tok].rank
                assert row_g[tok].logprob == pytest.approx(row_w[tok].logprob, rel=1e-5, abs=1e-5)
