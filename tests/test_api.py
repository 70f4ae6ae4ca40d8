"""The public API end to end on the real stories260K model: LLM.generate / LLM.chat input forms,
SamplingParams behaviour (n, stops, lengths, special tokens), rejection of bad input without harming
the engine, the LLMEngine add/step/abort loop, stats, and prefix caching."""
from __future__ import annotations

import math
import random

import pytest

from conftest import assert_no_leak
from tram import LLM, SamplingParams

PROMPT = "Once upon a time"
GREEDY = SamplingParams(temperature=0, max_tokens=40)
EOS_IDS = {1, 2}  # stories260K stops on </s> (tokenizer eos) and <s> (generation config)


def greedy_ids(llm: LLM, prompt, max_tokens: int = 40) -> list[int]:
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0]
    return out.outputs[0].token_ids


def random_prompt(seed: int, length: int) -> list[int]:
    """A prompt no other test uses, so nothing of it is in the prefix cache yet."""
    rng = random.Random(seed)
    return [1] + [rng.randrange(3, 512) for _ in range(length - 1)]


def drain(engine, max_steps: int = 2000) -> dict[str, list]:
    """Step until nothing is unfinished; every output of every step, per request id."""
    seen: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return seen
        for out in engine.step():
            seen.setdefault(out.request_id, []).append(out)
    raise AssertionError(f"engine still has unfinished requests after {max_steps} steps: "
                         f"{list(engine.output_processor.requests)}")


@pytest.fixture(scope="module")
def ref(stories_llm: LLM) -> dict:
    """Greedy references on the shared LLM (computed once)."""
    llm = stories_llm
    tok = llm.get_tokenizer()
    long = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=400), use_tqdm=False)[0]
    story = long.outputs[0]
    assert story.finish_reason == "stop" and story.token_ids[-1] == 1, "the reference story must end on BOS"
    return {
        "once": greedy_ids(llm, PROMPT, 40),
        "tom": greedy_ids(llm, "Tom and his dog", 40),
        # A prompt after which greedy decoding immediately ends the story with BOS (id 1).
        "story_end": long.prompt_token_ids + story.token_ids[:-1],
        "tok": tok,
    }


@pytest.fixture(autouse=True)
def no_request_left_behind(stories_llm: LLM):
    """A test that leaves requests unfinished fails here, and they are aborted so that later tests
    (whose LLM.generate would otherwise wait on them forever) still run."""
    yield
    engine = stories_llm.llm_engine
    left = list(engine.output_processor.requests)
    left_core = list(engine.engine_core.scheduler.requests)
    engine.abort_request(left)
    engine.engine_core.abort_requests(left_core)
    engine.output_processor.sample_owner.clear()
    assert not left and not left_core, f"requests left unfinished: {left} (core: {left_core})"


@pytest.fixture(scope="module")
def small_llm(stories_path: str) -> LLM:
    """No prefix caching, two sequences at a time, and the smallest cache that fits one context
    (32 blocks of 16 = 512 tokens), so that two long requests must preempt each other."""
    return LLM(stories_path, max_num_seqs=2, enable_prefix_caching=False, num_gpu_blocks_override=32)


@pytest.fixture
def small(small_llm: LLM):
    yield small_llm
    assert_no_leak(small_llm.llm_engine)


# ----------------------------------------------------------------------------- input forms


def test_single_string_prompt(llm, ref):
    outs = llm.generate(PROMPT, GREEDY, use_tqdm=False)
    assert isinstance(outs, list) and len(outs) == 1
    out = outs[0]
    assert out.prompt == PROMPT
    assert out.prompt_token_ids == ref["tok"].encode(PROMPT) == [1, 403, 407, 261, 378]
    assert out.finished is True
    assert len(out.outputs) == 1 and out.outputs[0].index == 0
    assert out.outputs[0].token_ids == ref["once"]
    assert isinstance(out.request_id, str) and out.request_id


def test_all_prompt_forms_mixed_keep_input_order(llm, ref):
    tok = ref["tok"]
    tom_ids = tok.encode("Tom and his dog")
    prompts = [
        PROMPT,
        {"prompt": "Tom and his dog"},
        {"prompt_token_ids": tom_ids},
        {"prompt_token_ids": tok.encode(PROMPT), "prompt": "custom text"},
    ]
    # Different lengths so they finish out of input order.
    params = [SamplingParams(temperature=0, max_tokens=m) for m in (40, 3, 25, 1)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outs) == 4
    assert [o.prompt for o in outs] == [PROMPT, "Tom and his dog", None, "custom text"]
    assert [o.prompt_token_ids for o in outs] == [tok.encode(PROMPT), tom_ids, tom_ids, tok.encode(PROMPT)]
    assert [o.outputs[0].token_ids for o in outs] == [ref["once"], ref["tom"][:3], ref["tom"][:25], ref["once"][:1]]
    assert len({o.request_id for o in outs}) == 4
    for o in outs:
        assert o.finished and len(o.outputs) == 1 and o.outputs[0].index == 0
        assert o.outputs[0].finish_reason == "length"


def test_list_of_strings_with_one_params(llm, ref):
    outs = llm.generate([PROMPT, "Tom and his dog", PROMPT], SamplingParams(temperature=0, max_tokens=12),
                        use_tqdm=False)
    assert [o.prompt for o in outs] == [PROMPT, "Tom and his dog", PROMPT]
    assert [o.outputs[0].token_ids for o in outs] == [ref["once"][:12], ref["tom"][:12], ref["once"][:12]]


def test_default_sampling_params_give_16_tokens(llm):
    out = llm.generate({"prompt_token_ids": random_prompt(11, 8)}, use_tqdm=False)[0]
    c = out.outputs[0]
    assert len(c.token_ids) == 16 or (c.finish_reason == "stop" and c.token_ids[-1] in EOS_IDS)


def test_wrong_number_of_sampling_params(llm):
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate([PROMPT, "Tom and his dog"], [GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(PROMPT, [GREEDY, GREEDY], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_num_cached_tokens_and_metrics(llm):
    ids = random_prompt(1, 40)
    first = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    again = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    # Two full blocks of 16 are cached; the last prompt token is always recomputed.
    assert again.num_cached_tokens == 32
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    for out in (first, again):
        m = out.metrics
        assert m is not None
        assert m.first_token_time is not None and m.last_token_time is not None and m.finished_time is not None
        assert m.arrival_time <= m.first_token_time <= m.last_token_time <= m.finished_time
        assert m.num_generation_tokens == len(out.outputs[0].token_ids) == 40


# ---------------------------------------------------------------------------------- n > 1


def test_n_seeded_samples_differ_and_the_call_is_reproducible(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=1234, max_tokens=24)
    a = llm.generate([PROMPT, "Tom and his dog"], params, use_tqdm=False)
    b = llm.generate([PROMPT, "Tom and his dog"], params, use_tqdm=False)
    for out_a, out_b in zip(a, b):
        assert out_a.finished
        assert [c.index for c in out_a.outputs] == [0, 1, 2, 3]
        samples = [tuple(c.token_ids) for c in out_a.outputs]
        assert len(set(samples)) == 4, "seeded samples of one request must differ"
        assert samples == [tuple(c.token_ids) for c in out_b.outputs]
        assert [c.text for c in out_a.outputs] == [c.text for c in out_b.outputs]
    # The same seed in a different batch (alone) gives the same samples.
    alone = llm.generate(PROMPT, params, use_tqdm=False)[0]
    assert [c.token_ids for c in alone.outputs] == [c.token_ids for c in a[0].outputs]


def test_n_greedy_samples_equal_the_single_greedy_output(llm, ref):
    out = llm.generate(PROMPT, SamplingParams(n=3, temperature=0, max_tokens=40), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert c.token_ids == ref["once"]
        assert c.finish_reason == "length"
    assert len({c.text for c in out.outputs}) == 1


# ------------------------------------------------------------------------------ stopping


def test_stop_string_excluded(llm, ref):
    tok = ref["tok"]
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop="Lily"), use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == "Lily"
    assert c.text == ", there was a little girl named "
    # Tokens up to and including the one that completed the stop string (" Lily" is index 9).
    assert c.token_ids == ref["once"][:10]
    assert tok.convert_ids_to_tokens(c.token_ids[-1]) == "\u2581Lily"


def test_stop_string_included_and_cut_inside_a_token(llm, ref):
    sp = SamplingParams(temperature=0, max_tokens=40, stop=["zzz", "Lil"], include_stop_str_in_output=True)
    c = llm.generate(PROMPT, sp, use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == "Lil"
    assert c.text == ", there was a little girl named Lil"
    assert c.token_ids == ref["once"][:10]
    sp = SamplingParams(temperature=0, max_tokens=40, stop=["girl named"])
    c = llm.generate(PROMPT, sp, use_tqdm=False)[0].outputs[0]
    assert (c.text, c.stop_reason) == (", there was a little ", "girl named")


def test_stop_string_never_seen_runs_to_length(llm, ref):
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=["qqqq"]), use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "length" and c.stop_reason is None
    assert c.token_ids == ref["once"]


def test_stop_token_ids(llm, ref):
    tok = ref["tok"]
    period = 426
    k = ref["once"].index(period)
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[period]),
                     use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == period
    assert c.token_ids == ref["once"][: k + 1]
    # Like vLLM, the stop token itself is not rendered.
    full = tok.decode(tok.encode(PROMPT) + ref["once"][:k], skip_special_tokens=True)
    assert c.text == full[len(PROMPT):] and not c.text.endswith(".")


def test_eos_stops_with_reason(llm, ref):
    c = llm.generate({"prompt_token_ids": ref["story_end"]}, SamplingParams(temperature=0, max_tokens=20),
                     use_tqdm=False)[0].outputs[0]
    # BOS is a generation-config eos, so it is reported as the stop reason (as in vLLM).
    assert c.token_ids == [1] and c.finish_reason == "stop" and c.stop_reason == 1
    assert c.text == ""


def test_ignore_eos_gives_exactly_max_tokens(llm, ref):
    c = llm.generate({"prompt_token_ids": ref["story_end"]},
                     SamplingParams(temperature=0, max_tokens=7, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(c.token_ids) == 7 and c.finish_reason == "length" and c.stop_reason is None
    assert c.token_ids[0] == 1  # the eos it ignored


def test_min_tokens_masks_eos(llm, ref):
    c = llm.generate({"prompt_token_ids": ref["story_end"]},
                     SamplingParams(temperature=0, max_tokens=30, min_tokens=10), use_tqdm=False)[0].outputs[0]
    assert len(c.token_ids) >= 10
    assert not EOS_IDS & set(c.token_ids[:10])


def test_min_tokens_masks_stop_token_ids(llm, ref):
    period = 426
    assert ref["once"].index(period) < 14
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, min_tokens=14, stop_token_ids=[period]),
                     use_tqdm=False)[0].outputs[0]
    assert len(c.token_ids) >= 14
    assert period not in c.token_ids[:13]
    if c.finish_reason == "stop":
        assert c.token_ids[-1] in {period} | EOS_IDS and period not in c.token_ids[:-1]


def test_max_tokens_none_runs_to_the_context_limit(llm, ref):
    prompt = (ref["story_end"] * 2)[:470]
    c = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                     use_tqdm=False)[0].outputs[0]
    assert len(c.token_ids) == 42 and c.finish_reason == "length"
    # Without ignore_eos it runs until eos or the context limit, never beyond.
    c = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=None),
                     use_tqdm=False)[0].outputs[0]
    assert len(c.token_ids) <= 42
    assert len(c.token_ids) == 42 or c.finish_reason == "stop"


def test_prompt_of_exactly_max_model_len_gets_one_token(llm):
    c = llm.generate({"prompt_token_ids": random_prompt(2, 512)}, SamplingParams(temperature=0, max_tokens=None),
                     use_tqdm=False)[0].outputs[0]
    assert len(c.token_ids) == 1


def test_skip_special_tokens(llm, ref):
    prompt = {"prompt_token_ids": ref["story_end"]}
    shown = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                skip_special_tokens=False), use_tqdm=False)[0].outputs[0]
    hidden = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0]
    assert shown.token_ids == hidden.token_ids and shown.token_ids[0] == 1
    assert shown.text.startswith("<s>")
    assert "<s>" not in hidden.text and hidden.text.strip()
    assert shown.text.replace("<s>", "", 1) == hidden.text


def test_detokenize_false(llm, ref):
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, detokenize=False), use_tqdm=False)[0].outputs[0]
    assert c.text == ""
    assert c.token_ids == ref["once"]


# ---------------------------------------------------------------------------------- chat


def test_chat_single_conversation(llm, ref):
    conv = [{"role": "user", "content": PROMPT}]
    outs = llm.chat(conv, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    assert len(outs) == 1
    out = outs[0]
    assert out.prompt_token_ids[0] == 1 and out.prompt_token_ids[1] != 1
    assert out.prompt_token_ids.count(1) == 1
    assert out.prompt_token_ids == ref["tok"].encode(PROMPT)
    assert out.outputs[0].token_ids == ref["once"]
    assert out.finished and out.outputs[0].index == 0


def test_chat_list_of_conversations(llm, ref):
    tok = ref["tok"]
    convs = [
        [{"role": "user", "content": "Tom and his dog"}],
        [{"role": "system", "content": "Once upon"}, {"role": "user", "content": "a time"}],
        [{"role": "user", "content": PROMPT}],
    ]
    outs = llm.chat(convs, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert len(outs) == 3
    for out in outs:
        assert out.prompt_token_ids[0] == 1 and out.prompt_token_ids.count(1) == 1
        assert out.finished
    assert outs[0].outputs[0].token_ids == ref["tom"][:12]
    assert outs[2].outputs[0].token_ids == ref["once"][:12]
    assert tok.decode(outs[1].prompt_token_ids, skip_special_tokens=True) == "Once upon\na time"
    assert outs[1].prompt_token_ids != outs[2].prompt_token_ids


# ------------------------------------------------------------------------------ bad input

BAD_PARAMS = [
    ({"n": 0}, r"\bn\b"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 3}, "min_tokens"),
    ({"logprobs": -2}, "logprobs"),
    ({"prompt_logprobs": -2}, "prompt_logprobs"),
    ({"stop": [""]}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"n": 1.5}, r"\bn\b"),
]


def assert_still_serves(llm: LLM, ref: dict) -> None:
    assert not llm.llm_engine.has_unfinished_requests()
    assert not llm.llm_engine.engine_core.scheduler.requests
    assert llm.llm_engine.check_kv_integrity()["in_use"] == 0
    assert greedy_ids(llm, PROMPT, 40) == ref["once"]


@pytest.mark.parametrize("kwargs,field", BAD_PARAMS, ids=[str(k) for k, _ in BAD_PARAMS])
def test_invalid_sampling_params_name_the_field(llm, ref, kwargs, field):
    with pytest.raises(ValueError, match=field):
        llm.generate(PROMPT, SamplingParams(**kwargs), use_tqdm=False)
    assert_still_serves(llm, ref)


BAD_REQUESTS = [
    ({"prompt_token_ids": [1] + [403] * 512}, {}, "maximum model length"),
    ({"prompt_token_ids": []}, {}, "empty"),
    ({"prompt_token_ids": [1, 403, 512]}, {}, "vocabulary"),
    ({"prompt_token_ids": [1, -1, 403]}, {}, "vocabulary"),
    ({"prompt_token_ids": [1, "x"]}, {}, "prompt_token_ids"),
    ({"no_prompt": "x"}, {}, "prompt"),
    (PROMPT, {"logprobs": 21}, "logprobs"),
    (PROMPT, {"prompt_logprobs": 21}, "prompt_logprobs"),
    # -1 means the whole vocabulary (512 here), which is above max_logprobs=20 (vLLM rejects it).
    (PROMPT, {"logprobs": -1}, "logprobs"),
    (PROMPT, {"prompt_logprobs": -1}, "prompt_logprobs"),
    # A bias on a token the model cannot produce must be rejected up front, not crash the step.
    (PROMPT, {"logit_bias": {600: 5.0}}, "logit_bias"),
]


@pytest.mark.parametrize("prompt,kwargs,match", BAD_REQUESTS,
                         ids=["too_long", "empty", "id_512", "id_neg", "id_str", "no_prompt_key",
                              "logprobs_21", "prompt_logprobs_21", "logprobs_-1", "prompt_logprobs_-1",
                              "logit_bias_oov"])
def test_invalid_request_raises_and_engine_keeps_serving(llm, ref, prompt, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, **kwargs), use_tqdm=False)
    assert_still_serves(llm, ref)


def test_too_long_prompt_message(llm, ref):
    with pytest.raises(ValueError, match=r"\(length 513\).*maximum model length of 512"):
        llm.generate({"prompt_token_ids": [1] + [403] * 512}, use_tqdm=False)
    with pytest.raises(ValueError, match="maximum model length"):
        llm.generate(" ".join(["Once upon a time"] * 200), use_tqdm=False)
    assert_still_serves(llm, ref)


def test_one_bad_prompt_in_a_list_queues_nothing(llm, ref):
    engine = llm.llm_engine
    queries = engine.get_stats().prefix_cache_queries
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([PROMPT, "Tom and his dog", {"prompt_token_ids": [1, 9999]}], GREEDY, use_tqdm=False)
    bad_params = [GREEDY, SamplingParams(temperature=0, logprobs=50), GREEDY]
    with pytest.raises(ValueError, match="logprobs"):
        llm.generate([PROMPT, PROMPT, PROMPT], bad_params, use_tqdm=False)
    assert not engine.has_unfinished_requests()
    assert not engine.engine_core.scheduler.requests and not engine.engine_core.scheduler.waiting
    assert engine.get_stats().prefix_cache_queries == queries  # nothing was ever scheduled
    assert_still_serves(llm, ref)


def test_failure_inside_the_step_loop_aborts_the_call_cleanly(llm, ref, monkeypatch):
    engine = llm.llm_engine
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)
    with pytest.raises(RuntimeError, match="boom"):
        llm.generate([PROMPT, "Tom and his dog"], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
    assert_still_serves(llm, ref)


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
    engine.add_request("join-b", {"prompt_token_ids": tok.encode("Tom and his dog")},
                       SamplingParams(temperature=0, max_tokens=10))
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
    engine.add_request("ab-long", {"prompt_token_ids": random_prompt(3, 70)},
                       SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    engine.add_request("ab-short", PROMPT, SamplingParams(temperature=0, max_tokens=30))
    engine.add_request("ab-n", "Tom and his dog", SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=100,
                                                                ignore_eos=True))
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
        engine.add_request(f"st-{i}", {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=5,
                                                                              ignore_eos=True))
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
    prompts = [(ref["story_end"][i * 40:] * 2)[:200] for i in range(3)]
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


# --------------------------------------------------------------------------- prefix caching

PREFIX_TEXT = (
    "Sam had a small red boat. Every morning he took the boat to the pond near his house and "
    "watched the ducks swim around it. His sister Mia liked to come too, and she always brought "
    "bread for the ducks. One sunny day,"
)


def test_prefix_cache_hit_keeps_greedy_output(llm, small, ref):
    tok = ref["tok"]
    a_ids = tok.encode(PREFIX_TEXT + " Sam saw a big frog.")
    b_ids = tok.encode(PREFIX_TEXT + " Mia found a shiny stone.")
    common = next(i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y)
    assert common >= 48, "the shared prefix must cover at least three blocks of 16"
    params = SamplingParams(temperature=0, max_tokens=30)
    engine = llm.llm_engine
    before = engine.get_stats()
    out_a = llm.generate({"prompt_token_ids": a_ids}, params, use_tqdm=False)[0]
    mid = engine.get_stats()
    out_b = llm.generate({"prompt_token_ids": b_ids}, params, use_tqdm=False)[0]
    after = engine.get_stats()
    assert out_a.num_cached_tokens == 0
    assert out_b.num_cached_tokens == common // 16 * 16 >= 48
    assert after.prefix_cache_hits - mid.prefix_cache_hits == out_b.num_cached_tokens
    assert mid.prefix_cache_hits == before.prefix_cache_hits
    assert after.prefix_cache_queries - mid.prefix_cache_queries == len(b_ids)

    plain = small.generate([{"prompt_token_ids": a_ids}, {"prompt_token_ids": b_ids}], params, use_tqdm=False)
    assert [o.num_cached_tokens for o in plain] == [0, 0]
    assert out_a.outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert out_b.outputs[0].token_ids == plain[1].outputs[0].token_ids
    assert out_b.outputs[0].text == plain[1].outputs[0].text
    assert small.llm_engine.get_stats().prefix_cache_hits == 0
