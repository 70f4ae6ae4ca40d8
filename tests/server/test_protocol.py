"""The request models pass stop strings and logit_bias through to SamplingParams, the one place that
normalises and validates them, and pick the output kind from `stream`."""

from __future__ import annotations

import pytest

from tram.sampling_params import RequestOutputKind
from tram.server.protocol.openai import ChatCompletionRequest, CompletionRequest


def params(**body):
    return CompletionRequest(prompt="Once", **body).to_sampling_params(body.get("max_tokens", 16), {}, None)


def test_stop_and_logit_bias_are_normalised_by_sampling_params():
    p = params(stop="The end", logit_bias={"5": 1, " 7": -100}, stop_token_ids=None)
    assert p.stop == ["The end"] and p.logit_bias == {5: 1.0, 7: -100.0} and p.stop_token_ids == []
    assert params(stop=None).stop == [] and params(stop=["a", "b"]).stop == ["a", "b"]


@pytest.mark.parametrize(
    "body,words",
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias keys"),
        ({"logit_bias": {"-5": 1}}, "logit_bias keys"),
        ({"stop": ["ok", ""]}, "empty string"),
    ],
)
def test_bad_values_are_rejected_by_sampling_params(body, words):
    with pytest.raises(ValueError, match=words):
        params(**body)


def test_streams_get_deltas_and_the_rest_one_final_output():
    assert params(stream=True).output_kind == RequestOutputKind.DELTA
    assert params().output_kind == RequestOutputKind.FINAL_ONLY
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    assert chat.to_sampling_params(8, {}, None).output_kind == RequestOutputKind.DELTA
