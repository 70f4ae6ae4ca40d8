"""LLMEngine driven step by step: requests joining and leaving, aborts, request ids, stats and
preemption on a small cache."""

from __future__ import annotations

import pytest
from api_helpers import GREEDY, PROMPT, drain, random_prompt

from tram import SamplingParams

pytestmark = pytest.mark.usefixtures("no_request_left_behind")

# ---------------------------------------------------------------------- LLMEngine directly


def test_engine_requests_join_at_different_steps(llm, ref):
    engine = llm.llm_engine
    tok = ref["tok"]
    engine.add_request("join-a", PROMPT, SamplingParams(temperature=0, max_tokens=20))
    assert engine.has_unfinished_requests()
    streamed: dict[str, list] = {"join-a": [], "join-b": []}
    for _ in range(5):
        for out in engine.step():
            streamed[out.request_id].append(out)
    engine.add_request(
        "join-b", {"prompt_token_ids": tok.encode("Tom and his dog")}, SamplingParams(temperature=0, max_tokens=10)
    )
    for rid, outs in drain(engine).items():
        streamed[rid].extend(outs)
    assert not engine.has_unfinished_requests()
    a, b = streamed["join-a"], streamed["join-b"]
    # One token per step, cumulative outputs, only the last one finished.
    assert [len(o.outputs[0].token_ids) for o in a] == list(range(1, 21))
    assert [len(o.outputs[0].token_ids) for o in b] == list(range(1, 11))
    assert [o.finished for o in a] == [False] * 19 + [True]
    assert a[-1].outputs[0].token_ids == ref["once"][:20]
    assert b[-1].outputs[0].token_ids == ref["tom"][:10]
    assert b[-1].prompt is None and a[-1].prompt == PROMPT
    assert a[-1].outputs[0].finish_reason == "length"
    assert a[-1].outputs[0].text.startswith(", there was a little girl named Lily.")
    # Streamed text only grows.
    texts = [o.outputs[0].text for o in a]
    assert all(t2.startswith(t1) for t1, t2 in zip(texts, texts[1:]))


def test_abort_running_request_frees_blocks_and_silences_it(llm, ref):
    engine = llm.llm_engine
    engine.add_request(
        "ab-long",
        {"prompt_token_ids": random_prompt(3, 70)},
        SamplingParams(temperature=0, max_tokens=100, ignore_eos=True),
    )
    engine.add_request("ab-short", PROMPT, SamplingParams(temperature=0, max_tokens=30))
    engine.add_request(
        "ab-n", "Tom and his dog", SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=100, ignore_eos=True)
    )
    for _ in range(4):
        engine.step()
    assert engine.get_stats().num_running_reqs == 4
    in_use = engine.check_kv_integrity()["in_use"]
    engine.abort_request("ab-long")
    after = engine.check_kv_integrity()["in_use"]
    assert after < in_use
    assert after >= 2  # ab-short and ab-n still hold theirs
    engine.abort_request(["ab-n", "no-such-request"])
    assert engine.get_stats().num_running_reqs == 1
    seen = drain(engine)
    assert set(seen) == {"ab-short"}
    assert seen["ab-short"][-1].outputs[0].token_ids == ref["once"][:30]
    assert engine.check_kv_integrity()["in_use"] == 0
    assert not engine.output_processor.sample_owner  # aborted samples are forgotten too


def test_abort_waiting_request(llm):
    engine = llm.llm_engine
    engine.add_request("wait-1", PROMPT, GREEDY)
    assert engine.get_stats().num_waiting_reqs == 1
    engine.abort_request("wait-1")
    assert not engine.has_unfinished_requests()
    assert engine.get_stats().num_waiting_reqs == 0
    assert engine.step() == []


def test_duplicate_request_id(llm, ref):
    engine = llm.llm_engine
    engine.add_request("dup", PROMPT, SamplingParams(temperature=0, max_tokens=8))
    with pytest.raises(ValueError, match="dup"):
        engine.add_request("dup", "Tom and his dog", SamplingParams(temperature=0, max_tokens=8))
    seen = drain(engine)
    assert list(seen) == ["dup"]
    assert seen["dup"][-1].outputs[0].token_ids == ref["once"][:8]
    # Once finished, the id may be used again.
    engine.add_request("dup", "Tom and his dog", SamplingParams(temperature=0, max_tokens=8))
    assert drain(engine)["dup"][-1].outputs[0].token_ids == ref["tom"][:8]


def test_request_id_colliding_with_an_n_sample_id(llm, ref):
    """n > 1 fans out into core requests "0_<id>", "1_<id>"; a user id equal to one of those must be
    rejected without corrupting the request that owns it."""
    engine = llm.llm_engine
    engine.add_request("x", PROMPT, SamplingParams(n=2, temperature=0, max_tokens=5))
    try:
        with pytest.raises(ValueError):
            engine.add_request("0_x", "Tom and his dog", SamplingParams(temperature=0, max_tokens=5))
        seen = drain(engine, max_steps=100)
        assert list(seen) == ["x"], "the rejected request must produce no output"
        final = seen["x"][-1]
        assert final.finished
        assert [c.token_ids for c in final.outputs] == [ref["once"][:5]] * 2
    finally:
        engine.abort_request(["x", "0_x"])


def test_n_sample_id_colliding_with_an_existing_request_id(llm, ref):
    """The other order: "0_y" exists, then "y" with n=2 would fan out into "0_y" again."""
    engine = llm.llm_engine
    engine.add_request("0_y", "Tom and his dog", SamplingParams(temperature=0, max_tokens=5))
    try:
        with pytest.raises(ValueError):
            engine.add_request("y", PROMPT, SamplingParams(n=2, temperature=0, max_tokens=5))
        seen = drain(engine, max_steps=100)
        assert list(seen) == ["0_y"], "the rejected request must produce no output"
        assert seen["0_y"][-1].finished
        assert seen["0_y"][-1].outputs[0].token_ids == ref["tom"][:5]
    finally:
        engine.abort_request(["y", "0_y"])


def test_engine_rejects_bad_input_before_queuing(llm, ref):
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="maximum model length"):
        engine.add_request("bad", {"prompt_token_ids": [1] * 513}, GREEDY)
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.add_request("bad", PROMPT, {"temperature": 0})
    assert not engine.has_unfinished_requests()
    engine.add_request("bad", PROMPT, SamplingParams(temperature=0, max_tokens=6))
    assert drain(engine)["bad"][-1].outputs[0].token_ids == ref["once"][:6]


def test_get_stats(llm):
    engine = llm.llm_engine
    s0 = engine.get_stats()
    assert (s0.num_running_reqs, s0.num_waiting_reqs) == (0, 0)
    assert 0.0 <= s0.kv_cache_usage <= 1.0
    prompts = [random_prompt(10 + i, 20 + i) for i in range(3)]
    for i, p in enumerate(prompts):
        engine.add_request(
            f"st-{i}", {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        )
    s1 = engine.get_stats()
    assert (s1.num_running_reqs, s1.num_waiting_reqs) == (0, 3)
    engine.step()
    s2 = engine.get_stats()
    assert (s2.num_running_reqs, s2.num_waiting_reqs) == (3, 0)
    assert 0.0 < s2.kv_cache_usage <= 1.0
    assert s2.kv_cache_usage == pytest.approx(engine.check_kv_integrity()["in_use"] / 2048)
    assert s2.prefix_cache_queries - s1.prefix_cache_queries == sum(len(p) for p in prompts)
    assert s2.prefix_cache_hits == s1.prefix_cache_hits  # never seen before
    assert engine.last_stats.num_running_reqs == 3
    drain(engine)
    s3 = engine.get_stats()
    assert (s3.num_running_reqs, s3.num_waiting_reqs) == (0, 0)
    assert s3.kv_cache_usage == 0.0
    assert s3.num_preemptions == s0.num_preemptions  # the shared LLM has room for everything


def test_waiting_and_preemption_stats_on_a_small_cache(small, llm, ref):
    engine = small.llm_engine
    prompts = [(ref["story_end"][i * 40 :] * 2)[:200] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"pre-{i}", {"prompt_token_ids": p}, params)
    engine.step()
    s = engine.get_stats()
    assert (s.num_running_reqs, s.num_waiting_reqs) == (2, 1)  # max_num_seqs=2
    assert 0.0 < s.kv_cache_usage <= 1.0
    seen = drain(engine)
    s = engine.get_stats()
    # Two requests growing to 350 tokens (22 blocks each) cannot share 32 blocks.
    assert s.num_preemptions > 0
    assert s.prefix_cache_hits == 0
    expected = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for i, e in enumerate(expected):
        got = seen[f"pre-{i}"][-1].outputs[0]
        assert got.token_ids == e.outputs[0].token_ids and len(got.token_ids) == 150


def test_one_rank_runs_the_plain_step(llm, ref):
    core = llm.llm_engine.engine_core
    assert core.step_fn == core.step  # chosen at start-up; pipeline stages get step_with_batch_queue
    engine = llm.llm_engine
    engine.add_request("plain", PROMPT, SamplingParams(temperature=0, max_tokens=6))
    assert drain(engine)["plain"][-1].outputs[0].token_ids == ref["once"][:6]
    assert not core.batch_queue
