"""Engine-level behaviour of vLLM's extra request fields (allowed_token_ids, truncate_prompt_tokens),
64-bit bounds on every integer, and transactional submission: a request that fails between being
registered and the core accepting it leaves nothing behind."""

from __future__ import annotations

import pytest
from api_helpers import PROMPT, assert_no_leak

from tram import SamplingParams
from tram.sampling_params import SamplingParamError


@pytest.mark.parametrize(
    "field,value",
    [
        ("top_k", 10**30),
        ("min_tokens", 2**63),
        ("max_tokens", 2**70),
        ("n", 2**64),
        ("logprobs", 2**63),
        ("prompt_logprobs", -(2**70)),
        ("truncate_prompt_tokens", 2**63),
        ("seed", 2**64),
        ("stop_token_ids", [2**63]),
        ("allowed_token_ids", [2**64]),
        ("logit_bias", {2**63: 1.0}),
        ("temperature", 10**400),
    ],
)
def test_integers_beyond_64_bits_name_their_field(field: str, value: object) -> None:
    with pytest.raises(SamplingParamError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field and field in str(info.value)
    assert len(str(info.value)) < 200  # a 10**400 is not spelt out in full


def test_allowed_token_ids_restrict_every_sampled_token(llm, no_request_left_behind) -> None:
    tok = llm.get_tokenizer()
    allowed = sorted({tok.encode(w, add_special_tokens=False)[-1] for w in (" cat", " dog", " sun")})
    free = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0].outputs[0]
    for params in (
        SamplingParams(temperature=0, max_tokens=12, allowed_token_ids=allowed),
        SamplingParams(temperature=1.0, seed=3, max_tokens=12, allowed_token_ids=allowed),
    ):
        out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
        assert out.token_ids and set(out.token_ids) <= set(allowed), out.token_ids
    assert not set(free.token_ids) <= set(allowed)  # the restriction changed something
    # A batch mixing restricted and free requests: the free one is untouched.
    both = llm.generate(
        [PROMPT, PROMPT],
        [
            SamplingParams(temperature=0, max_tokens=12, allowed_token_ids=allowed),
            SamplingParams(temperature=0, max_tokens=12),
        ],
        use_tqdm=False,
    )
    assert set(both[0].outputs[0].token_ids) <= set(allowed)
    assert both[1].outputs[0].token_ids == free.token_ids


def test_allowed_token_ids_outside_the_vocabulary_are_refused(llm, no_request_left_behind) -> None:
    with pytest.raises(ValueError, match="allowed_token_ids"):
        llm.generate(PROMPT, SamplingParams(allowed_token_ids=[1, 10_000]), use_tqdm=False)


def test_truncate_prompt_tokens_keeps_the_end_of_the_prompt(llm, no_request_left_behind) -> None:
    ids = llm.get_tokenizer().encode("Once upon a time there was a little girl named Lily. She liked")
    greedy = SamplingParams(temperature=0, max_tokens=10)
    direct = llm.generate({"prompt_token_ids": ids[-6:]}, greedy, use_tqdm=False)[0]
    truncated = llm.generate(
        {"prompt_token_ids": ids},
        SamplingParams(temperature=0, max_tokens=10, truncate_prompt_tokens=6),
        use_tqdm=False,
    )[0]
    assert truncated.prompt_token_ids == ids[-6:]
    assert truncated.outputs[0].token_ids == direct.outputs[0].token_ids
    # A prompt over the context fits once truncated.
    long_ids = (ids * 60)[:700]
    out = llm.generate(
        {"prompt_token_ids": long_ids}, SamplingParams(max_tokens=2, truncate_prompt_tokens=100), use_tqdm=False
    )[0]
    assert len(out.prompt_token_ids) == 100 and out.prompt is None


def test_a_text_too_long_by_its_length_alone_is_refused_before_tokenizing(llm, no_request_left_behind) -> None:
    processor = llm.llm_engine.input_processor
    too_long = "a" * (processor.max_chars_per_token * processor.max_model_len + 1)
    with pytest.raises(ValueError, match="characters"):
        llm.generate(too_long, SamplingParams(max_tokens=1), use_tqdm=False)


def test_a_failed_submission_is_unregistered(stories_llm, monkeypatch) -> None:
    """The second sample of an n=2 request fails on its way to the core: the request leaves the front
    end and its first sample is aborted in the core."""
    engine = stories_llm.llm_engine
    real_add = engine.engine_core.add_request
    calls = []

    def failing_add(request) -> None:
        calls.append(request.request_id)
        if len(calls) == 2:
            raise OverflowError("can't serialize")
        real_add(request)

    monkeypatch.setattr(engine.engine_core, "add_request", failing_add)
    with pytest.raises(OverflowError):
        engine.add_request("tx", PROMPT, SamplingParams(n=2, max_tokens=4))
    assert len(calls) == 2
    assert not engine.output_processor.requests and not engine.output_processor.sample_owner
    assert not engine.engine_core.scheduler.requests
    monkeypatch.undo()
    engine.add_request("tx", PROMPT, SamplingParams(n=2, max_tokens=4))  # the id is free again
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leak(engine)
