"""The one prompt-length check (InputProcessor.check_prompt_length) and its two rules: offline the
prompt must fit; the OpenAI server's rule (as vLLM's) also wants room for the whole completion."""

from __future__ import annotations

import pytest

from tram import SamplingParams
from tram.engine.input_processor import InputProcessor, LengthRule, PromptTooLongError

SERVER = LengthRule(completion_must_fit=True)
CHAT = LengthRule(completion_must_fit=True, prompt_field="messages")


@pytest.fixture
def processor() -> InputProcessor:
    return InputProcessor(tokenizer=None, vocab_size=512, max_model_len=32, max_logprobs=20)


def prompt(n: int) -> dict:
    return {"prompt_token_ids": [5] * n}


def test_offline_rule_checks_the_prompt_only(processor):
    assert processor.process(prompt(32), SamplingParams(max_tokens=100))[1] == [5] * 32
    with pytest.raises(PromptTooLongError, match=r"\(length 33\).*maximum model length of 32") as e:
        processor.process(prompt(33), SamplingParams())
    assert isinstance(e.value, ValueError)
    assert (e.value.param, e.value.code) == ("prompt", "context_length_exceeded")


@pytest.mark.parametrize("rule,field", [(SERVER, "prompt"), (CHAT, "messages")])
def test_server_rule_wants_room_for_the_completion(processor, rule, field):
    processor.process(prompt(24), SamplingParams(max_tokens=8), rule)  # exactly fits
    with pytest.raises(PromptTooLongError, match="you requested 33 tokens") as e:
        processor.process(prompt(24), SamplingParams(max_tokens=9), rule)
    assert e.value.param == "max_tokens" and "maximum context length is 32" in str(e.value)
    with pytest.raises(PromptTooLongError, match=f"your {field}") as e:
        processor.process(prompt(33), SamplingParams(max_tokens=1), rule)
    assert e.value.param == field
    # No max_tokens means "to the end of the context": one token must still fit.
    processor.process(prompt(31), SamplingParams(max_tokens=None), rule)
    with pytest.raises(PromptTooLongError):
        processor.process(prompt(32), SamplingParams(max_tokens=None), rule)
