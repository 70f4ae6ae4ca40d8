"""tram/structured_output/xgrammar_schema.py's list of what xgrammar does not enforce, held to the
installed xgrammar: for each schema, an instance that breaks it. Tram refuses the schema exactly
when xgrammar's grammar accepts that instance, so an xgrammar that starts enforcing a keyword (or
stops) fails here, naming the case. The schemas pydantic and the openai SDK write pass untouched;
schema_finite.py's check for `$ref` loops refuses only loops with no way out."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any, Literal

import openai
import pytest
import xgrammar as xgr
from conftest import STORIES
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from tram.structured_output.schema_finite import endless_ref
from tram.structured_output.xgrammar_schema import FORMATS, unenforced

I = {"type": "integer"}  # noqa: E741 - a type, read as such in the cases
S = {"type": "string"}


def obj(**kw: Any) -> dict[str, Any]:
    return {"type": "object", **kw}


def ref_to(target: dict, **siblings: Any) -> dict[str, Any]:
    return {"$defs": {"A": target}, "$ref": "#/$defs/A", **siblings}


# name -> (schema, an instance that breaks it)
CASES: dict[str, tuple[Any, Any]] = {
    "type": (obj(properties={"a": I}, required=["a"]), {"a": "x"}),
    "if/then": (obj(properties={"a": I, "b": I}, **{"if": {"required": ["a"]}, "then": {"required": ["b"]}}), {"a": 1}),
    "if/else": (obj(properties={"a": I, "b": I}, **{"if": {"required": ["a"]}, "else": {"required": ["b"]}}), {}),
    "dependentSchemas": (obj(properties={"a": I, "b": I}, dependentSchemas={"a": {"required": ["b"]}}), {"a": 1}),
    "dependentRequired": (obj(properties={"a": I, "b": I}, dependentRequired={"a": ["b"]}), {"a": 1}),
    "dependencies": (obj(properties={"a": I, "b": I}, dependencies={"a": ["b"]}), {"a": 1}),
    "not": ({"not": S}, "s"),
    "not {}": ({"not": {}}, True),
    "contains": ({"type": "array", "contains": {"const": 1}}, []),
    "uniqueItems": ({"type": "array", "items": I, "uniqueItems": True}, [1, 1]),
    "multipleOf integer": ({"type": "integer", "multipleOf": 3}, 4),
    "multipleOf number": ({"type": "number", "multipleOf": 0.5}, 0.3),
    "multipleOf untyped": ({"multipleOf": 3}, 4),
    "patternProperties": (obj(patternProperties={"^x": I}), {"x": "s"}),
    "unevaluatedProperties": (obj(properties={"a": I}, unevaluatedProperties=False), {"a": 1, "c": 2}),
    "unevaluatedItems": ({"type": "array", "prefixItems": [I], "unevaluatedItems": False}, [1, 2]),
    "propertyNames": (obj(propertyNames={"pattern": "^a"}, additionalProperties=I), {"b": 1}),
    "maxProperties": (obj(maxProperties=1), {"a": 1, "b": 2}),
    "maxProperties untyped": ({"maxProperties": 1}, {"a": 1, "b": 2}),
    "minItems untyped": ({"minItems": 2}, [1]),
    "minimum untyped": ({"minimum": 3}, 1),
    "minLength untyped": ({"minLength": 3}, "a"),
    "bounds on a type list": ({"type": ["string", "null"], "maxLength": 2}, "abcd"),
    "exclusiveMinimum": ({"type": "number", "exclusiveMinimum": 0}, 0),
    "pattern": ({"type": "string", "pattern": "^a+$"}, "b"),
    "pattern with maxLength": ({"type": "string", "pattern": "^a+$", "maxLength": 2}, "aaaa"),
    "format with maxLength": ({"type": "string", "format": "email", "maxLength": 5}, "abc@def.gh"),
    "format with pattern": ({"type": "string", "format": "date", "pattern": "^2"}, "1999-01-01"),
    "format untyped": ({"format": "date"}, "!!"),
    "allOf of one": ({"allOf": [S]}, 1),
    "allOf of two": ({"allOf": [I, {"minimum": 5}]}, 1),
    "allOf beside type": ({"type": "integer", "allOf": [S]}, "abc"),
    "anyOf": ({"anyOf": [I, S]}, True),
    "anyOf beside maxLength": ({"anyOf": [S, I], "maxLength": 1}, "abc"),
    "anyOf beside type": ({"type": "string", "anyOf": [{"type": "string", "maxLength": 5}, I]}, 1),
    "$ref beside description": (ref_to(S, description="d"), 1),
    "$ref beside maxLength": (ref_to(S, maxLength=1), "abc"),
    "$ref beside required": (ref_to(obj(properties={"a": I}), required=["a"]), {}),
    "$ref to an anchor": ({"$defs": {"A": {"$anchor": "a", **S}}, "$ref": "#a"}, 1),
    "$ref elsewhere": ({"$ref": "http://example.com/s.json"}, 1),
    "$ref into properties": (
        obj(properties={"a": I, "b": {"$ref": "#/properties/a"}}, required=["a", "b"]),
        {"a": 1, "b": "s"},
    ),
    "$dynamicRef": ({"$dynamicAnchor": "n", "type": "array", "items": {"$dynamicRef": "#n"}}, [1]),
    "enum beside a type it breaks": ({"type": "string", "enum": ["a", 1]}, 1),
    "enum beside maxLength": ({"enum": ["a", "bbb"], "maxLength": 2}, "bbb"),
    "enum": ({"type": "string", "enum": ["a", "b"]}, "c"),
    "const": ({"const": {"a": 1}}, {"a": 2}),
    "required, undeclared": (obj(required=["z"], additionalProperties=I), {}),
    "required, declared": (obj(properties={"a": I}, required=["a"]), {}),
    "required, closed": (obj(properties={"a": I}, required=["a", "b"], additionalProperties=False), {"a": 1}),
    "additionalProperties": (obj(properties={"a": I}, additionalProperties=S), {"a": 1, "b": 2}),
    "prefixItems": ({"type": "array", "prefixItems": [I, S]}, [1, 2]),
    "maxItems": ({"type": "array", "maxItems": 1}, [1, 2]),
    **{f"format {f}": ({"type": "string", "format": f}, "!! (]") for f in sorted(FORMATS)},
    **{f"format {f}": ({"type": "string", "format": f}, "!! (]") for f in ("iri", "idn-email", "regex", "password")},
}


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(STORIES), stop_token_ids=[2])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def xgrammar_accepts(compiler: xgr.GrammarCompiler, schema: Any, instance: Any) -> bool:
    """Whether the grammar Tram compiles (strict, no optional whitespace) accepts the instance's
    text as it would write it (", " and ": " separators) and then a stop token."""
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True))
    return matcher.accept_string(json.dumps(instance)) and matcher.accept_token(2)


@pytest.mark.parametrize("case", list(CASES))
def test_refused_exactly_when_xgrammar_does_not_enforce(compiler: xgr.GrammarCompiler, case: str) -> None:
    schema, breaking = CASES[case]
    refused = unenforced(schema)
    assert (refused is not None) == xgrammar_accepts(compiler, schema, breaking), refused


class Pet(BaseModel):
    name: str = Field(min_length=1, max_length=10, description="its name")
    kind: Literal["cat", "dog"]


class Owner(BaseModel):
    name: str = Field(pattern=r"^[A-Z][a-z]+$")
    age: int = Field(ge=0, le=120)
    ratio: float = Field(gt=0, lt=1)
    pet: Pet = Field(description="the pet")
    spare: Pet | None = None
    tags: list[str] = Field(max_length=3)
    born: datetime.date
    id: uuid.UUID
    scores: dict[str, int]
    friends: list[Owner] = []


@pytest.mark.parametrize(
    "schema",
    [
        Owner.model_json_schema(),
        to_strict_json_schema(Owner),
        openai.pydantic_function_tool(Owner)["function"]["parameters"],
    ],
    ids=["pydantic", "strict", "tool"],
)
def test_the_schemas_pydantic_writes_pass(schema: dict) -> None:
    assert unenforced(schema) is None and endless_ref(schema) is None


NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "additionalProperties": False}
LOOPS = {
    "required self": ({"$defs": {"node": {**NODE, "required": ["next"]}}, "$ref": "#/$defs/node"}, "#/$defs/node"),
    "root": ({**NODE, "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, "#"),
    "two defs": (
        {
            "$defs": {
                "a": {"allOf": [{"$ref": "#/$defs/b"}]},
                "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1},
            },
            "$ref": "#/$defs/a",
        },
        "#/$defs/a",
    ),
}
WAYS_OUT = {
    "optional": {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
    "null branch": {
        "$defs": {
            "node": {
                **NODE,
                "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                "required": ["next"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "empty array": {"$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "$ref": "#/$defs/node"},
    "unresolved": {"$ref": "#/$defs/missing"},
}


@pytest.mark.parametrize("case", list(LOOPS))
def test_a_ref_loop_with_no_way_out_is_found(case: str) -> None:
    schema, ref = LOOPS[case]
    assert endless_ref(schema) == ref


@pytest.mark.parametrize("case", list(WAYS_OUT))
def test_a_ref_loop_with_a_way_out_passes(case: str) -> None:
    assert endless_ref(WAYS_OUT[case]) is None
