"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) on a real `tram serve`
through the official `anthropic` SDK (and httpx for the raw events and bad bodies): greedy text and
token counts equal /v1/chat/completions for the same conversation; the stream's events come in
Anthropic's order and add up to the whole answer; stop_sequences end it with stop_reason
stop_sequence; forced tool choices ("any", a named tool) give a tool_use block whose input the
tool's schema accepts; a tool_result round trip; bad requests are 400s in Anthropic's error shape,
naming the field; leaving a stream aborts its request. Without a server: the auto tool choice's
stream of blocks (a hermes call after text), a reasoning parser's thinking as a thinking block, and
the API key sent as Anthropic's clients send it.

The server is test_structured_outputs_api's (any-whitespace off: the tiny model would otherwise pad
a forced call's JSON with whitespace until max_tokens); the SDK has no temperature argument any
more, so greedy requests send it as an extra body field."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import anthropic
import httpx
import jsonschema
import openai
import pytest
from conftest import STORIES
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer, assert_idle

from tram.outputs import CompletionOutput, RequestOutput
from tram.server.api_server import _auth_middleware
from tram.server.handlers.anthropic_message import MessageBuilder
from tram.server.handlers.anthropic_stream import stream_message
from tram.server.protocol.openai import ChatCompletionRequest
from tram.server.reasoning import get_reasoning_parser
from tram.server.reasoning.plan import ReasoningPlan, ReasoningSetup
from tram.server.tools.chat import plan_tools
from tram.server.tools.parsers import get_tool_parser

SERVER = ServerSpec(
    STORIES, ("--structured-outputs-disable-any-whitespace", "--structured-outputs-compile-timeout", "1")
)
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)

GREEDY = {"extra_body": {"temperature": 0}}
STORY = [{"role": "user", "content": "Tell me a story"}]


def closed_object(**properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


WEATHER = closed_object(city={"type": "string", "maxLength": 8}, unit={"enum": ["c", "f"]})
TOOLS = [
    {"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER},
    {"name": "get_time", "description": "The time in a zone.", "input_schema": closed_object(zone={"enum": ["UTC"]})},
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
# "any" with one call at most: an array of calls grows until max_tokens on the tiny model.
FORCED = [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather"}]


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    yield from pool_server(SERVER)


@pytest.fixture
def client(server: RemoteServer) -> anthropic.Anthropic:
    """The SDK's client; after the test no request is left and no KV block in use."""
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60) as sdk:
        yield sdk
    assert_idle(server)


def create(client: anthropic.Anthropic, **kw) -> anthropic.types.Message:
    kw = {"model": STORIES, "max_tokens": 20, "messages": STORY, **GREEDY, **kw}
    return client.messages.create(**kw)


def chat_reference(
    server: RemoteServer, messages: list[dict], max_tokens: int, **kw
) -> openai.types.chat.ChatCompletion:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60) as sdk:
        return sdk.chat.completions.create(model=STORIES, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def sse_events(server: RemoteServer, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of a raw stream: the SDK's iterator hides the pings."""
    events, name = [], None
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name, (name, data)
                events.append((name, data))
    return events


# ---- text ---------------------------------------------------------------------------------------


def test_text_is_chat_s_answer(client: anthropic.Anthropic, server: RemoteServer) -> None:
    message = create(client)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    [block] = message.content
    chat = chat_reference(server, STORY, 20)
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens == 20
    assert client.messages.count_tokens(model=STORIES, messages=STORY).input_tokens == message.usage.input_tokens


def test_stream_events_in_anthropic_s_order(client: anthropic.Anthropic, server: RemoteServer) -> None:
    whole = create(client)
    events = sse_events(server, {"model": STORIES, "max_tokens": 20, "messages": STORY, "temperature": 0})
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for n, d in events if n == "content_block_delta")
    assert text == whole.content[0].text
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == 20

    # The SDK's stream helper accumulates the same message.
    with client.messages.stream(model=STORIES, max_tokens=20, messages=STORY, **GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 20


def aborted(server: RemoteServer) -> float:
    """The server's count of requests that finished by an abort."""
    families = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
    samples = [s for fam in families for s in fam.samples if s.name == "tram:request_success_total"]
    [value] = [s.value for s in samples if s.labels.get("finished_reason") == "abort"]
    return value


def test_leaving_a_stream_early_aborts_the_request(client: anthropic.Anthropic, server: RemoteServer) -> None:
    before = aborted(server)
    long_story = [{"role": "user", "content": "Tom and his dog"}]  # greedy: runs to the end of the context
    with client.messages.stream(model=STORIES, max_tokens=480, messages=long_story, **GREEDY) as stream:
        assert any(event.type == "content_block_delta" for event in stream)  # the first one, then leave
    assert_idle(server)
    assert aborted(server) == before + 1


def test_system_prompt(client: anthropic.Anthropic, server: RemoteServer) -> None:
    system = "You tell short stories."
    plain = create(client, system=system)
    blocks = create(client, system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}])
    chat = chat_reference(server, [{"role": "system", "content": system}, *STORY], 20)
    assert plain.content[0].text == blocks.content[0].text == chat.choices[0].message.content
    assert plain.usage.input_tokens == blocks.usage.input_tokens == chat.usage.prompt_tokens
    assert plain.usage.input_tokens > create(client).usage.input_tokens
    counted = client.messages.count_tokens(model=STORIES, messages=STORY, system=system)
    assert counted.input_tokens == plain.usage.input_tokens


def test_stop_sequences(client: anthropic.Anthropic, server: RemoteServer) -> None:
    text = create(client, max_tokens=40).content[0].text
    stop = text.split()[3]  # a word the greedy answer writes
    cut = text[: text.index(stop)]
    message = create(client, max_tokens=40, stop_sequences=[stop, "never written"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == cut
    with client.messages.stream(model=STORIES, max_tokens=40, messages=STORY, stop_sequences=[stop], **GREEDY) as s:
        assert "".join(s.text_stream) == cut
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_prefill_continues_the_assistant_s_message(client: anthropic.Anthropic, server: RemoteServer) -> None:
    messages = [*STORY, {"role": "assistant", "content": "Once upon a time"}]
    message = create(client, messages=messages)
    chat = chat_reference(
        server, messages, 20, extra_body={"continue_final_message": True, "add_generation_prompt": False}
    )
    assert message.content[0].text == chat.choices[0].message.content


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    grown: bool


def test_structured_output(client: anthropic.Anthropic) -> None:
    """output_config.format is chat's json_schema response_format; the SDK's parse() reads it back."""
    schema = closed_object(kind={"enum": ["cat", "dog"]})
    message = create(client, max_tokens=60, output_config={"format": {"type": "json_schema", "schema": schema}})
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), schema)
    parsed = client.messages.parse(model=STORIES, max_tokens=60, messages=STORY, output_format=Pet, **GREEDY)
    assert isinstance(parsed.parsed_output, Pet) and parsed.stop_reason == "end_turn"


# ---- tools --------------------------------------------------------------------------------------


def check_call(message: anthropic.types.Message, name: str | None) -> anthropic.types.ToolUseBlock:
    assert message.stop_reason == "tool_use", message
    [block] = message.content
    assert block.type == "tool_use" and block.id.startswith("toolu_") and block.name in SCHEMAS
    assert name in (None, block.name)
    assert isinstance(block.input, dict)
    jsonschema.validate(block.input, SCHEMAS[block.name])
    return block


@pytest.mark.parametrize("tool_choice", FORCED, ids=["any", "named"])
def test_forced_tool_call(client: anthropic.Anthropic, tool_choice: dict) -> None:
    kw = {"max_tokens": 100, "tools": TOOLS, "tool_choice": tool_choice}
    block = check_call(create(client, **kw), tool_choice.get("name"))
    with client.messages.stream(model=STORIES, messages=STORY, **GREEDY, **kw) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    streamed = check_call(final, tool_choice.get("name"))
    assert (streamed.name, streamed.input) == (block.name, block.input)  # greedy: the same call
    assert "input_json" in kinds and "text" not in kinds


def test_tool_result_round_trip(client: anthropic.Anthropic, server: RemoteServer) -> None:
    kw = {"max_tokens": 100, "tools": TOOLS}
    call = create(client, tool_choice=FORCED[1], **kw)
    block = check_call(call, "get_weather")
    messages = [
        *STORY,
        {"role": "assistant", "content": call.content},  # the SDK's blocks, sent back as they came
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny, 21 C"}]},
    ]
    answer = create(client, messages=messages, tool_choice={"type": "none"}, **kw)
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    # The prompt holds the call and its result, as the chat endpoint renders them.
    chat = chat_reference(
        server,
        [
            *STORY,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": json.dumps(block.input)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": block.id, "content": "sunny, 21 C"},
        ],
        100,
    )
    assert answer.content[0].text == chat.choices[0].message.content
    assert answer.usage.input_tokens == chat.usage.prompt_tokens > call.usage.input_tokens
    counted = client.messages.count_tokens(model=STORIES, messages=messages, tools=TOOLS)
    assert counted.input_tokens == answer.usage.input_tokens
    # And a forced call after the result.
    check_call(create(client, messages=messages, tool_choice=FORCED[0], **kw), None)


# ---- bad requests -------------------------------------------------------------------------------

BAD = {
    "unknown block type": (
        {"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
        "messages.0.content.0.type",
    ),
    "unknown tool_use_id": (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]}
            ]
        },
        "messages.0.content.0.tool_use_id",
    ),
    "missing max_tokens": ({"max_tokens": None}, "max_tokens"),
    "no content blocks": ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    "tool_use from the user": (
        {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
        "messages.0.content.0",
    ),
    "tool_choice names no tool": ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "fly"}}, "tool_choice.name"),
    "tool_choice any without tools": ({"tool_choice": {"type": "any"}}, "tool_choice"),
    "temperature above 1": ({"temperature": 1.5}, "temperature"),
    "unknown field": ({"frequency_penalty": 1}, "frequency_penalty"),
    "server tool": ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
    "thinking": ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    "effort": ({"output_config": {"effort": "high"}}, "output_config.effort"),
    "forced call and output format": (
        {"tools": TOOLS, "tool_choice": FORCED[1], "output_config": {"format": {"type": "json_schema", "schema": {}}}},
        "tool_choice",
    ),
}


# Cases that only /v1/messages can meet (its own fields, or a clash decided when sampling).
NOT_COUNTED = {"missing max_tokens", "temperature above 1", "forced call and output format"}


@pytest.mark.parametrize("case", BAD)
def test_bad_request_is_a_400_naming_the_field(client: anthropic.Anthropic, server: RemoteServer, case: str) -> None:
    change, field = BAD[case]
    body = {k: v for k, v in {"model": STORIES, "max_tokens": 5, "messages": STORY, **change}.items() if v is not None}
    requests = [("/v1/messages", body)]
    if case not in NOT_COUNTED:
        requests.append(("/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"}))
    for path, sent in requests:
        r = httpx.post(server.url + path, json=sent, timeout=60)
        assert r.status_code == 400, (path, r.text)
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        assert error["error"]["message"].startswith(field + ":"), error


def test_the_sdk_raises_the_error(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        create(
            client, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]
        )
    assert e.value.body["error"]["message"].startswith("messages.0.content.0.type")
    with pytest.raises(anthropic.NotFoundError) as e:
        create(client, model="claude-nonexistent")
    assert e.value.body["error"]["type"] == "not_found_error"


# ---- without a server ---------------------------------------------------------------------------


def streamed(message: MessageBuilder, pieces: list[str]) -> list[dict]:
    """The events' data of a message whose output arrives in these pieces, the last one ending it."""

    async def outputs():
        for i, piece in enumerate(pieces):
            finish = "stop" if i == len(pieces) - 1 else None
            c = CompletionOutput(0, piece, [i], None, None, finish)
            yield RequestOutput("r", None, [1, 2, 3], [c], finish is not None)

    async def events() -> list[str]:
        return [e async for e in stream_message(message, outputs())]

    return [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(events())]


def test_auto_tool_choice_streams_text_then_a_tool_use_block() -> None:
    """The server's --tool-call-parser (hermes) finds the call after some text: a text block, then
    a tool_use block whose input arrives as JSON fragments, and stop_reason tool_use."""
    chat_req = ChatCompletionRequest.model_validate(
        {"messages": STORY, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]}
    )
    plan = plan_tools(chat_req.tools, chat_req.tool_choice, get_tool_parser("hermes"), True)
    call = ["\n<tool_call>\n", '{"name": "get_weather", ', '"arguments": {"city": "Paris", ', '"unit": "c"}}']
    pieces = ["Sure.", *call, "\n</tool_call>"]
    parsed = streamed(MessageBuilder("m", 3, plan), pieces)
    names = [p["type"] for p in parsed]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    starts = [p for p in parsed if p["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    assert starts[1]["index"] == 1 and starts[1]["content_block"]["name"] == "get_weather"
    deltas = [p for p in parsed if p["type"] == "content_block_delta"]
    text = "".join(d["delta"].get("text", "") for d in deltas if d["index"] == 0)
    arguments = "".join(d["delta"].get("partial_json", "") for d in deltas if d["index"] == 1)
    assert text.strip() == "Sure." and json.loads(arguments) == {"city": "Paris", "unit": "c"}
    assert parsed[-2]["delta"]["stop_reason"] == "tool_use" and parsed[-2]["usage"]["output_tokens"] == len(pieces)


def test_thinking_is_a_thinking_block() -> None:
    """With a --reasoning-parser (qwen3; the prompt opened the thinking), the thinking comes first
    as a thinking block, signed as it closes, then the answer as a text block: whole and streamed."""
    reasoning = ReasoningPlan(ReasoningSetup(get_reasoning_parser("qwen3"), [0]), thinking=True)
    plan = plan_tools(None, None, None, False)
    pieces = [" Once upon", " time", "</think>", " Lily was", " happy"]
    parsed = streamed(MessageBuilder("m", 3, plan, reasoning), pieces)
    starts = [p["content_block"] for p in parsed if p["type"] == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""}]
    deltas = [p["delta"] for p in parsed if p["type"] == "content_block_delta"]
    kinds = [d["type"] for d in deltas]
    assert kinds.index("signature_delta") == kinds.index("text_delta") - 1  # closes the thinking block
    assert "".join(d.get("thinking", "") for d in deltas) == " Once upon time"
    assert "".join(d.get("text", "") for d in deltas) == " Lily was happy"
    message = MessageBuilder("m", 3, plan, reasoning)
    message.finish_reason = "stop"
    thinking, text = message.whole("".join(pieces))["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == " Once upon time" and thinking["signature"]
    assert text == {"type": "text", "text": " Lily was happy"}


def test_the_api_key_as_anthropic_s_clients_send_it() -> None:
    app = FastAPI()
    _auth_middleware(app, "secret")
    app.post("/v1/messages")(lambda: {"ok": True})
    with TestClient(app) as http:
        assert http.post("/v1/messages", headers={"x-api-key": "secret"}).status_code == 200
        assert http.post("/v1/messages", headers={"authorization": "Bearer secret"}).status_code == 200
        assert http.post("/v1/messages", headers={"x-api-key": "wrong"}).status_code == 401
        assert http.post("/v1/messages").status_code == 401
