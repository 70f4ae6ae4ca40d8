"""Closing JSON before the budget ends (tram/structured_output/json_closing.py): every closing of
every prefix of a JSON text makes it parse, a complete or non-JSON text has none, and on
stories260K a json_object request (which it never ended before: 0 of 100) ends within its tokens
(at least 95% of 64 samples: the shared LLM's batch holds 64)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tram.sampling_params import SamplingParams, StructuredOutputsParams
from tram.structured_output.json_closing import closings

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(JSON_VALUES, st.sampled_from([(", ", ": "), (",", ":")]), st.booleans())
def test_every_prefix_closes_to_valid_json(value: object, separators: tuple[str, str], ascii_only: bool) -> None:
    text = json.dumps(value, separators=separators, ensure_ascii=ascii_only)
    if not text.startswith(("{", "[")):
        text = json.dumps({"k": value}, separators=separators, ensure_ascii=ascii_only)
    for cut in range(len(text)):
        prefix = text[:cut]
        found = closings(prefix)
        assert found, prefix
        for closing in found:
            json.loads(prefix + closing)
    assert closings(text) == []


@pytest.mark.parametrize("text", ['{"a": 1}x', "}", '{"a" 1'])
def test_what_is_not_json_has_no_closing(text: str) -> None:
    assert closings(text) == []


def test_json_object_ends_before_max_tokens(llm) -> None:
    params = SamplingParams(
        n=64, seed=0, temperature=1.0, max_tokens=60, structured_outputs=StructuredOutputsParams(json_object=True)
    )
    [out] = llm.generate(["Once upon a time"], params)
    ended = [c for c in out.outputs if c.finish_reason == "stop"]
    for c in ended:
        assert isinstance(json.loads(c.text), dict), c.text
    assert len(ended) >= 61, [c.text[-40:] for c in out.outputs if c.finish_reason != "stop"][:5]
