"""The one walk over a client's schema: each fault found wherever it is, in the client's words, and a
schema given as text held to the same rules as one given as an object."""

from __future__ import annotations

import json

import pytest

from tram.sampling_params import SamplingParamError, StructuredOutputsParams
from tram.sampling_params.client_json import MAX_JSON_DEPTH
from tram.sampling_params.json_scan import json_fault


def nested(depth: int) -> dict:
    value: dict = {"type": "integer"}
    for _ in range(depth - 1):
        value = {"items": value}
    return value


def test_a_clean_schema_has_no_fault() -> None:
    schema = {"type": "object", "properties": {"é": {"enum": ["ü", 2**63 - 1, -(2**63), 1.5, None, True]}}}
    assert json_fault(schema) is None


def test_depth_is_counted_from_the_top_and_the_limit_itself_is_allowed() -> None:
    assert json_fault(nested(MAX_JSON_DEPTH)) is None
    assert json_fault(nested(MAX_JSON_DEPTH + 1)) == f"it is nested more than {MAX_JSON_DEPTH} levels deep"
    assert json_fault(nested(50_000)) is not None  # iterative: no RecursionError


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30])
def test_integers_msgpack_cannot_carry(value: int) -> None:
    assert json_fault({"a": [{"maximum": value}]}) == "it holds an integer beyond 64 bits"


def test_a_lone_surrogate_is_named_by_its_path() -> None:
    fault = json_fault({"properties": {"name": {"pattern": "ab\ud800"}}})
    assert fault is not None and "U+D800 at index 2 of 'properties.name.pattern'" in fault
    key_fault = json_fault({"properties": {"\udfff": {}}})
    assert key_fault is not None and "U+DFFF in a key of 'properties'" in key_fault


@pytest.mark.parametrize(
    "schema,words",
    [
        (nested(MAX_JSON_DEPTH + 5), "nested more than"),
        ({"maximum": 2**70}, "beyond 64 bits"),
        ({"enum": ["\ud800"]}, "lone surrogate"),
    ],
)
def test_params_refuse_each_fault_whether_the_schema_is_an_object_or_text(schema: dict, words: str) -> None:
    for given in (schema, json.dumps(schema)):
        with pytest.raises(SamplingParamError) as info:
            StructuredOutputsParams(json=given, source_field="guided_json")
        assert info.value.param == "guided_json" and words in str(info.value)
