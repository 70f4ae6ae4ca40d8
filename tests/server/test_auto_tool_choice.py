"""tool_choice "auto" end to end: a server with --enable-auto-tool-choice --tool-call-parser hermes
finds the calls the model writes in its text. stories260K never writes a call by itself, so a
grammar (structured_outputs, which "auto" leaves free) makes it write Hermes' format."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import STORIES
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer, settled_kv

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "pet",
            "description": "Pet an animal",
            "parameters": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]},
        },
    }
]
CALL = '<tool_call>\n{"name": "pet", "arguments": {"kind": "cat"}}\n</tool_call>'
# Some words, then the call: the words are content, the call becomes message.tool_calls.
GRAMMAR = 'root ::= "Sure." "\\n" ' + json.dumps(CALL)
MESSAGES = [{"role": "user", "content": "Pet the cat"}]
SERVER = ServerSpec(STORIES, ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"))
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    yield from pool_server(SERVER)


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def ask(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(
        model=str(STORIES),
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=80,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": GRAMMAR}},
        **kwargs,
    )


def test_auto_finds_the_call_in_the_text(client: openai.OpenAI, server: RemoteServer) -> None:
    choice = ask(client).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure.\n"
    [call] = choice.message.tool_calls
    assert call.id and call.type == "function" and call.function.name == "pet"
    assert json.loads(call.function.arguments) == {"kind": "cat"}
    assert settled_kv(server)["blocks"]["in_use"] == 0


def test_auto_streams_content_then_the_call(client: openai.OpenAI) -> None:
    content, calls, finish = "", {}, None
    for chunk in ask(client, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name == "pet"
                calls[d.index] = ""
            else:
                assert d.id is None
            calls[d.index] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Sure.\n"
    assert [json.loads(a) for a in calls.values()] == [{"kind": "cat"}]
    assert finish == "tool_calls"


def test_plain_text_stays_content(client: openai.OpenAI) -> None:
    choice = client.chat.completions.create(
        model=str(STORIES), messages=MESSAGES, tools=TOOLS, max_tokens=12, temperature=0
    ).choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_a_tool_result_continues_the_conversation(client: openai.OpenAI) -> None:
    first = ask(client).choices[0].message
    messages = MESSAGES + [
        {"role": "assistant", "content": first.content, "tool_calls": [c.model_dump() for c in first.tool_calls]},
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "The cat purrs."},
    ]
    reply = client.chat.completions.create(model=str(STORIES), messages=messages, tools=TOOLS, max_tokens=8)
    assert reply.choices[0].message.content is not None
