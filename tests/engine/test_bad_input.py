"""Bad input is rejected with a ValueError naming the field, nothing is queued, and the engine
keeps serving everyone else."""

from __future__ import annotations

import math

import pytest
from api_helpers import GREEDY, PROMPT, greedy_ids

from tram import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("no_request_left_behind")

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


@pytest.mark.parametrize(
    "prompt,kwargs,match",
    BAD_REQUESTS,
    ids=[
        "too_long",
        "empty",
        "id_512",
        "id_neg",
        "id_str",
        "no_prompt_key",
        "logprobs_21",
        "prompt_logprobs_21",
        "logprobs_-1",
        "prompt_logprobs_-1",
        "logit_bias_oov",
    ],
)
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
