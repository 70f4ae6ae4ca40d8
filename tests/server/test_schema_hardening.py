"""Issue 35, defects 2, 4, 5 and 6, on the session's default server (xgrammar, no flags):

- JSON a client sends as text (a schema, a structural tag, a tool call's arguments) or as a nested
  value (a schema, a tool's parameters, Responses' text.format) nested past the limit is a 400
  naming its field, where a schema text ~1,000 deep was a 500 (RecursionError out of json.loads);
- a schema keyword xgrammar would compile as if absent is a 400 naming it, as is a `$ref` loop no
  finite value satisfies, where both were 200s whose output broke the schema; `json_object` is an
  object (xgrammar's builtin JSON grammar allowed arrays); a 2,001-option choice is one of them;
- defect 4's path under xgrammar: a grammar that other settings leave no token fails the request
  (it was a 200 with "" and "stop");
- tool_choice "required" with a tool whose parameters hold `$defs` (what the SDK's
  pydantic_function_tool writes for a nested model) calls it validly, where it was a 400 "Cannot
  find field $defs".

The server has no --structured-outputs-disable-any-whitespace, and stories260K, left to itself,
writes whitespace inside JSON until max_tokens: requests that must finish ban its whitespace tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from conftest import STORIES
from pydantic import BaseModel, Field
from server_utils import RemoteServer, module_client, openai_client, shared_server
from structured_cases import MESSAGES, closed_object, json_schema_format

from tram.server.tools.parsers.forced import forced_tool_schema

# stories260K's tab, newline, space and "▁" tokens, and its two "[" tokens.
NO_WHITESPACE = {str(t): -100 for t in (12, 13, 35, 410)}
FAVOUR_ARRAYS = {"508": 100, "94": 100}
INT = {"type": "integer", "minimum": 0, "maximum": 9}
SELF_LOOP = {
    "$defs": {"node": closed_object(next={"$ref": "#/$defs/node"})},
    "$ref": "#/$defs/node",
}


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer) -> Iterator[RemoteServer]:
    yield from shared_server(stories_server)  # the session's default-flags server


@pytest.fixture(scope="module")
def http(server: RemoteServer) -> Iterator[httpx.Client]:
    yield from module_client(server)


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai_client(server)


# ---- defect 2: nested JSON ----------------------------------------------------------------------
def nested_text(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


NESTED = "__NESTED__"  # stands for a value nested 600 deep, spliced into the body as JSON text
TEXT = nested_text(1000)  # past json's own recursion limit in the API process
COMPLETION = {"model": STORIES, "prompt": "Hi", "max_tokens": 3}
CHAT = {"model": STORIES, "messages": MESSAGES, "max_tokens": 3}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": TEXT}}
TOOL_TURN = [
    *MESSAGES,
    {"role": "assistant", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
]
TAG = {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": NESTED, "end": "</a>"}], "triggers": ["<a>"]}
TEXT_FORMAT = {"format": {"type": "json_schema", "name": "out", "schema": NESTED}}
# case -> (route, body, the param the 400 names)
DEEP_CASES = {
    "guided_json text": ("/v1/completions", {**COMPLETION, "guided_json": TEXT}, "guided_json"),
    "chat guided_json text": ("/v1/chat/completions", {**CHAT, "guided_json": TEXT}, "guided_json"),
    "structured_outputs.json text": (
        "/v1/completions",
        {**COMPLETION, "structured_outputs": {"json": TEXT}},
        "structured_outputs",
    ),
    "structured_outputs.structural_tag": (
        "/v1/completions",
        {**COMPLETION, "structured_outputs": {"structural_tag": TEXT}},
        "structured_outputs",
    ),
    "tool call arguments": (
        "/v1/chat/completions",
        {**CHAT, "messages": TOOL_TURN},
        "messages.1.tool_calls.0.function.arguments",
    ),
    "guided_json value": ("/v1/completions", {**COMPLETION, "guided_json": NESTED}, "guided_json"),
    "response_format schema": (
        "/v1/chat/completions",
        {**CHAT, "response_format": json_schema_format(NESTED)},
        "response_format",
    ),
    "response_format structural_tag": ("/v1/chat/completions", {**CHAT, "response_format": TAG}, "response_format"),
    "tool parameters": (
        "/v1/chat/completions",
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": NESTED}}]},
        "tools.0.function.parameters",
    ),
    "responses text.format": (
        "/v1/responses",
        {"model": STORIES, "input": "Hi", "max_output_tokens": 3, "text": TEXT_FORMAT},
        "text.format.schema",
    ),
}


@pytest.mark.parametrize("case", list(DEEP_CASES))
def test_json_nested_too_deep_is_a_400_naming_its_field(http: httpx.Client, case: str) -> None:
    route, body, param = DEEP_CASES[case]
    content = json.dumps(body).replace(json.dumps(NESTED), nested_text(600))
    r = http.post(route, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] in param.split("|") and "nested more than 256 levels" in error["message"], error
    # The connection stays usable (a 500 here made uvicorn close it).
    assert http.post("/v1/completions", json={**COMPLETION, "max_tokens": 1}).status_code == 200


# ---- defect 5: what xgrammar does not enforce ----------------------------------------------------
IF_THEN = {**closed_object(a=INT), "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}
# case -> (schema, what the 400 names)
UNENFORCED = {
    "format xgrammar lacks": (closed_object(u={"type": "string", "format": "iri"}), "'format': 'iri'"),
    "if/then/else": (IF_THEN, "'if'/'then'/'else'"),
    "dependentSchemas": (
        {**closed_object(a=INT), "dependentSchemas": {"a": {"minProperties": 2}}},
        "'dependentSchemas'",
    ),
    "not": ({"not": {}}, "'not'"),
    "uniqueItems": ({"type": "array", "items": INT, "uniqueItems": True}, "'uniqueItems'"),
    "multipleOf on a number": (closed_object(x={"type": "number", "multipleOf": 0.5}), "'multipleOf'"),
    "maxLength beside format": (closed_object(e={"type": "string", "format": "email", "maxLength": 9}), "'maxLength'"),
    "required but undeclared": ({**closed_object(a=INT), "required": ["a", "b"]}, "'required' 'b'"),
    "allOf of two": (closed_object(n={"allOf": [INT, {"type": "integer", "maximum": 3}]}), "'allOf'"),
    "$ref loop": (SELF_LOOP, "no finite JSON value satisfies the schema"),
}


@pytest.mark.parametrize("case", list(UNENFORCED))
def test_unenforced_schema_is_a_400_naming_the_keyword(client: openai.OpenAI, case: str) -> None:
    schema, named = UNENFORCED[case]
    response_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=STORIES, messages=MESSAGES, max_tokens=5, response_format=response_format)
    assert info.value.param == "response_format" and named in info.value.body["message"], info.value.body


def test_keywords_xgrammar_enforces_hold(client: openai.OpenAI) -> None:
    """Formats xgrammar enforces, and unevaluatedProperties (its strict mode admits no property the
    schema does not name), compile and hold."""
    schema = {
        **closed_object(day={"type": "string", "format": "date"}, id={"type": "string", "format": "uuid"}),
        "unevaluatedProperties": False,
    }
    so = {"json": schema, "disable_any_whitespace": True}
    for seed in (1, 2):
        out = client.chat.completions.create(
            model=STORIES, messages=MESSAGES, max_tokens=80, seed=seed, extra_body={"structured_outputs": so}
        ).choices[0]
        assert out.finish_reason == "stop", out
        checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
        jsonschema.validate(json.loads(out.message.content), schema, format_checker=checker)


def test_json_object_is_an_object(client: openai.OpenAI) -> None:
    # With "[" favoured, xgrammar's builtin JSON grammar (any value) let the model write an array.
    for stream in (False, True):
        out = client.chat.completions.create(
            model=STORIES,
            messages=MESSAGES,
            max_tokens=6,
            temperature=0,
            stream=stream,
            response_format={"type": "json_object"},
            logit_bias={**NO_WHITESPACE, **FAVOUR_ARRAYS},
        )
        text = "".join(c.choices[0].delta.content or "" for c in out) if stream else out.choices[0].message.content
        assert text.lstrip().startswith("{"), text


def test_a_choice_of_2001_options_under_xgrammar(client: openai.OpenAI) -> None:
    choices = [f"opt{i}" for i in range(2001)]
    out = client.completions.create(model=STORIES, prompt="Hi", max_tokens=8, extra_body={"guided_choice": choices})
    assert out.choices[0].text in choices and out.choices[0].finish_reason == "stop", out


def test_a_grammar_left_no_token_is_an_error_not_an_empty_answer(client: openai.OpenAI) -> None:
    """allowed_token_ids that leave none of the grammar's tokens: the sampled token breaks the
    grammar, and the request fails naming the constraint (it was a 200 with "" and "stop"). At the
    grammar's end (min_tokens banning the stop token) the whole output still ends with "stop"."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=STORIES, prompt="Hi", max_tokens=8, extra_body={"guided_choice": ["yes"], "allowed_token_ids": [300]}
        )
    assert info.value.param == "guided_choice" and "masked" in info.value.body["message"], info.value.body
    out = client.completions.create(
        model=STORIES, prompt="Hi", max_tokens=8, extra_body={"guided_choice": ["yes"], "min_tokens": 6}
    ).choices[0]
    assert (out.text, out.finish_reason) == ("yes", "stop")


# ---- defect 6: forced tool calls with $defs -------------------------------------------------------
class Address(BaseModel):
    city: str = Field(max_length=6)
    zip: str = Field(pattern=r"^[0-9]{3}$")


class Person(BaseModel):
    name: str = Field(max_length=6)
    home: Address


class Tree(BaseModel):
    label: str = Field(max_length=4)
    children: list[Tree]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_required_tool_with_defs_calls_it(client: openai.OpenAI, stream: bool) -> None:
    tools = [openai.pydantic_function_tool(Person), openai.pydantic_function_tool(Address, name="where")]
    assert "$defs" in tools[0]["function"]["parameters"]  # the nested model is a reference
    out = client.chat.completions.create(
        model=STORIES,
        messages=MESSAGES,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=150,
        seed=1,
        stream=stream,
        logit_bias=NO_WHITESPACE,
    )
    if stream:
        chunks = [c.choices[0] for c in out if c.choices]
        name = next(d.delta.tool_calls[0].function.name for d in chunks if d.delta.tool_calls)
        args = "".join(d.delta.tool_calls[0].function.arguments or "" for d in chunks if d.delta.tool_calls)
        finish = chunks[-1].finish_reason
    else:
        (call,) = out.choices[0].message.tool_calls
        name, args, finish = call.function.name, call.function.arguments, out.choices[0].finish_reason
    assert finish == "tool_calls", (finish, args)
    (Person if name == "Person" else Address).model_validate_json(args)


def test_forced_schema_rebases_every_local_reference() -> None:
    """A recursive model's "#/$defs/Tree" (and a "#" to the parameters' own root) still name the
    same schemas once the parameters sit inside the array of calls."""
    tree = openai.pydantic_function_tool(Tree)
    own_root = {"type": "object", "properties": {"up": {"$ref": "#"}}, "additionalProperties": False}
    tools = [tree, {"type": "function", "function": {"name": "loop", "parameters": own_root}}]
    schema = forced_tool_schema(tools, "required")
    leaf = {"label": "b", "children": []}
    jsonschema.validate([{"name": "Tree", "parameters": {"label": "a", "children": [leaf]}}], schema)
    jsonschema.validate([{"name": "loop", "parameters": {"up": {"up": {}}}}], schema)
    for bad in ({"label": "a", "children": [{"label": "b"}]}, {"label": "a", "children": [], "x": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "Tree", "parameters": bad}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "loop", "parameters": {"up": {"down": 1}}}], schema)
