"""Issue 35, defects 4, 5 and 6, under llguidance (`--structured-outputs-backend guidance`):

- a grammar llguidance gives up on is an error to the client, never a 200 with "" and "stop": a
  guided_choice of 2,001 options (its `choice` grammar broke off past its parser's 2,000-item row
  limit) now holds, as one lexeme; a grammar past that limit at its first token is a 400 up front,
  and one that reaches it mid-generation fails the request (a 400, or an error event in a stream);
- a `$ref` loop that no finite value satisfies is a 400 (it broke off after "{" with "stop");
- tool_choice "required" with a tool whose parameters hold `$defs` calls it validly.

xgrammar's side of the same paths is in test_schema_hardening.py; no KV block may be left in use.
"""

from __future__ import annotations

import json

import openai
import pytest
from conftest import STORIES
from server_pool import ServerSpec
from server_utils import openai_module_fixtures
from structured_cases import MESSAGES, closed_object

SERVER = ServerSpec(
    STORIES, ("--structured-outputs-backend", "guidance", "--structured-outputs-disable-any-whitespace")
)
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)
server, client, no_kv_in_use = openai_module_fixtures(SERVER)

OPTIONS = [f"opt{i}" for i in range(2001)]  # one past llguidance's 2,000 items in a parser row
ALTERNATIVES = " | ".join(json.dumps(o) for o in OPTIONS)
SELF_LOOP = {
    "$defs": {"node": closed_object(next={"$ref": "#/$defs/node"})},
    "$ref": "#/$defs/node",
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_choice_of_2001_options_holds(client: openai.OpenAI, stream: bool) -> None:
    out = client.completions.create(
        model=STORIES, prompt="Hi", max_tokens=8, stream=stream, extra_body={"guided_choice": OPTIONS}
    )
    chunks = [c.choices[0] for c in out] if stream else out.choices
    text, finish = "".join(c.text for c in chunks), chunks[-1].finish_reason
    assert text in OPTIONS and finish == "stop", (text, finish)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_grammar_past_the_row_limit_is_a_400_up_front(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # at create(): before any stream event
        client.completions.create(
            model=STORIES,
            prompt="Hi",
            max_tokens=8,
            stream=stream,
            extra_body={"guided_grammar": f"root ::= {ALTERNATIVES}"},
        )
    assert info.value.param == "guided_grammar" and "max is 2000" in info.value.body["message"], info.value.body


def test_a_grammar_that_breaks_off_mid_generation_fails_the_request(client: openai.OpenAI) -> None:
    """Four free letters first: the grammar starts well and reaches the row limit at "opt"."""
    kw = {
        "model": STORIES,
        "prompt": "Hi",
        "max_tokens": 16,
        "temperature": 0,
        "extra_body": {"guided_grammar": f'root ::= [a-z] [a-z] [a-z] [a-z] " " ({ALTERNATIVES})'},
    }
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**kw)
    assert info.value.param == "guided_grammar" and "could not follow" in info.value.body["message"], info.value.body
    with pytest.raises(openai.APIError) as streamed:  # the stream has started: its error event
        list(client.completions.create(stream=True, **kw))
    assert "could not follow" in str(streamed.value), streamed.value
    ok = client.completions.create(model=STORIES, prompt="Hi", max_tokens=4, extra_body={"guided_choice": ["yes"]})
    assert ok.choices[0].text == "yes"  # the engine goes on


def test_a_grammar_left_no_token_is_an_error(client: openai.OpenAI) -> None:
    """allowed_token_ids that leave none of the grammar's tokens (llguidance names the token)."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=STORIES, prompt="Hi", max_tokens=8, extra_body={"guided_choice": ["yes"], "allowed_token_ids": [300]}
        )
    assert info.value.param == "guided_choice" and "could not follow" in info.value.body["message"], info.value.body


def test_a_ref_loop_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=STORIES,
            messages=MESSAGES,
            max_tokens=5,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": SELF_LOOP, "strict": True},
            },
        )
    body = info.value.body
    assert info.value.param == "response_format" and "no finite JSON value" in body["message"], body


def test_required_tool_with_defs_calls_it(client: openai.OpenAI) -> None:
    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=6)
        zip: str = Field(pattern=r"^[0-9]{3}$")

    class Person(BaseModel):
        name: str = Field(max_length=6)
        home: Address

    out = client.chat.completions.create(
        model=STORIES,
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(Person)],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=150,
        seed=1,
    ).choices[0]
    assert out.finish_reason == "tool_calls", out
    (call,) = out.message.tool_calls
    assert call.function.name == "Person"
    Person.model_validate_json(call.function.arguments)
