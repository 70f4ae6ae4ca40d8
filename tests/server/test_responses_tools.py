"""Function calling on `POST /v1/responses` through the official `openai` SDK against a real `tram
serve`: a forced call as a `function_call` output item, whole and streamed (OpenAI's events), the
conversation carried on with `function_call` + `function_call_output` items (rendered as the chat
endpoint renders the same calls and results), and bad tools, choices and items as 400s naming the
field. stories260K never calls a tool by itself, so tool_choice forces the calls: the tests check the
protocol, not the model's judgement (the grammar's compact JSON lets the tiny model end its
calls). Streaming with "auto" (content, then a call found by the server's parser) runs without a
server, through the same item stream. The session's shared default-flags server serves the module."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from conftest import STORIES
from server_utils import shared_openai_fixtures

from tram.server.handlers.responses import EventWriter
from tram.server.handlers.responses_items import ItemStream
from tram.server.protocol.responses import ResponsesRequest
from tram.server.tools.parsers import get_tool_parser

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CLOCK = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER},
    {"type": "function", "name": "get_time", "parameters": CLOCK, "strict": True},
]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
NAMED = {"type": "function", "name": "get_weather"}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"model": STORIES, "temperature": 0, "max_output_tokens": 200}


server, client, no_kv_in_use = shared_openai_fixtures()  # the session's default-flags server


def ask(client: openai.OpenAI, **kwargs):
    return client.responses.create(**{"input": QUESTION, "tools": TOOLS, **GREEDY, **kwargs})


def check_call(item, name: str | None = None) -> None:
    """A finished function_call item whose arguments follow its function's schema."""
    assert item.type == "function_call" and item.status == "completed", item
    assert item.id.startswith("fc_") and item.call_id and item.id != item.call_id, item
    assert item.name in SCHEMAS and (name is None or item.name == name), item
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])


def test_forced_call_then_its_result(client: openai.OpenAI) -> None:
    first = ask(client, tool_choice=NAMED)
    assert first.status == "completed" and first.incomplete_details is None
    (call,) = first.output
    check_call(call, "get_weather")
    assert first.output_text == ""
    # The request's tools and choice are echoed in this API's flat shape.
    assert [t.name for t in first.tools] == ["get_weather", "get_time"] and first.tools[0].parameters == WEATHER
    assert first.tool_choice.type == "function" and first.tool_choice.name == "get_weather"

    # The conversation goes on: the call as the API returned it, then the client's result for it.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    follow_up = [*QUESTION, *first.output, result]
    answer = ask(client, input=follow_up, tool_choice="none", max_output_tokens=12)
    (message,) = answer.output
    assert message.type == "message" and answer.output_text
    # The same conversation in chat's words renders to the same prompt and greedy answer.
    chat_call = {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"},
    ]
    chat = client.chat.completions.create(
        model=STORIES,
        messages=messages,
        tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS],
        tool_choice="none",
        temperature=0,
        max_tokens=12,
    )
    assert answer.output_text == chat.choices[0].message.content
    assert answer.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens

    # And another forced call after the result: "required" with one call at most.
    again = ask(client, input=follow_up, tool_choice="required", parallel_tool_calls=False)
    (call2,) = again.output
    check_call(call2)
    assert call2.call_id != call.call_id and again.parallel_tool_calls is False


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_forced_call_streamed(client: openai.OpenAI, tool_choice) -> None:
    whole = ask(client, tool_choice=tool_choice, parallel_tool_calls=False)
    events = list(ask(client, tool_choice=tool_choice, parallel_tool_calls=False, stream=True))
    types = [e.type for e in events]
    n = types.count("response.function_call_arguments.delta")
    assert n >= 1 and types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * n,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done, final = events[2].item, events[-2].item, events[-1].response
    # Announced with its name and ids and no arguments yet, as OpenAI does.
    assert added.type == "function_call" and added.status == "in_progress" and added.arguments == ""
    assert (added.id, added.call_id, added.name) == (done.id, done.call_id, done.name)
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == events[-3].arguments == done.arguments
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {done.id}
    check_call(done)
    (whole_call,) = whole.output
    # Greedy: the same call as the whole response; the final response holds the done item.
    assert (done.name, done.arguments) == (whole_call.name, whole_call.arguments)
    assert final.status == "completed" and [o.id for o in final.output] == [done.id]
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_sdk_stream_helper_rebuilds_the_call(client: openai.OpenAI) -> None:
    """The SDK's accumulator (strict about item ids and order) rebuilds the streamed call."""
    kwargs = {"input": QUESTION, "tools": TOOLS, "tool_choice": NAMED, **GREEDY}
    with client.responses.stream(**kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    (call,) = final.output
    check_call(call, "get_weather")


def test_no_tool_choice_is_text(client: openai.OpenAI) -> None:
    resp = ask(client, tool_choice="none", max_output_tokens=5)
    assert [o.type for o in resp.output] == ["message"] and resp.output_text


BAD = [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools.0.function"),  # chat's shape
    ({"tools": [{"type": "function", "name": "no spaces"}]}, "tools.0.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "mcp", "server_label": "x"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),  # no --enable-auto-tool-choice here
    ({"tools": TOOLS}, "tool_choice"),  # "auto" is the default with tools
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    (
        {
            "tools": TOOLS,
            "tool_choice": "required",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": CLOCK}},
        },
        "tool_choice",
    ),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "bogus"}}], "tool_choice": "required"}, None),
    ({"max_tool_calls": 2}, "max_tool_calls"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("extra,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_tools_are_400s(server, extra, param, stream) -> None:
    body = {"model": STORIES, "input": QUESTION, "max_output_tokens": 5, "stream": stream, **extra}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"], err
    assert param is None or err["param"] == param, err


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": '{"zone": "UTC"}'}
BAD_ITEMS = [
    ([{"type": "function_call_output", "call_id": "call_9", "output": "x"}], ["input[1].call_id", "call_9"]),
    ([CALL, {"type": "function_call_output", "call_id": "call_2", "output": "x"}], ["input[2].call_id"]),
    ([{**CALL, "call_id": ""}], ["input[1].call_id"]),
    ([{k: v for k, v in CALL.items() if k != "name"}], ["input[1].name"]),
    ([CALL, {"type": "function_call_output", "call_id": "call_1", "output": 3}], ["input[2].output"]),
    ([{"type": "web_search_call", "id": "ws_1"}], ["input[1]", "web_search_call"]),
]


@pytest.mark.parametrize("items,words", BAD_ITEMS, ids=[str(i) for i in range(len(BAD_ITEMS))])
def test_bad_items_are_400s(client: openai.OpenAI, items, words) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input=[*QUESTION, *items], tools=TOOLS, tool_choice="none", **GREEDY)
    body = e.value.body
    assert body["param"] == "input" and all(w in body["message"] for w in words), body


# ---- without a server --------------------------------------------------------------------------


def test_calls_in_a_row_are_one_assistant_turn() -> None:
    """Calls after an assistant's text join it (one turn, as chat writes parallel calls); results
    become tool messages answering their call."""
    req = ResponsesRequest(
        instructions="Be brief.",
        input=[
            *QUESTION,
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
            CALL,
            {**CALL, "call_id": "call_2"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "9:00"}]},
            {"type": "function_call_output", "call_id": "call_1", "output": "8:00"},
            CALL | {"call_id": "call_3"},
        ],
    )
    messages = [m.model_dump(exclude_none=True) for m in req.messages()]
    call = {"type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}
    assert messages == [
        {"role": "system", "content": "Be brief."},
        *QUESTION,
        {
            "role": "assistant",
            "content": "Let me see.",
            "tool_calls": [{"id": "call_1", **call}, {"id": "call_2", **call}],
        },
        {"role": "tool", "content": "9:00", "tool_call_id": "call_2"},
        {"role": "tool", "content": "8:00", "tool_call_id": "call_1"},
        {"role": "assistant", "tool_calls": [{"id": "call_3", **call}]},
    ]


def test_auto_streams_text_then_the_call() -> None:
    """ "auto" with the server's parser (hermes): the words are a message item, the call found in
    the text a function_call item after it, each finished before the next is added."""
    event = EventWriter()
    items = ItemStream(event, get_tool_parser("hermes").stream(), "msg_1")
    text = 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    chunks = [*items.begin()]
    for i in range(0, len(text), 5):  # in pieces, as DELTA outputs come
        chunks += items.feed(text[i : i + 5])
    chunks += items.end("completed")
    events = [json.loads(c.split("data: ", 1)[1]) for c in chunks]
    types = [e["type"] for e in events]
    text_deltas = types.count("response.output_text.delta")
    arg_deltas = types.count("response.function_call_arguments.delta")
    assert types == [
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * text_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * arg_deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    message, call = items.items
    assert message["id"] == "msg_1" and message["content"][0]["text"] == "Sure.\n" and message["status"] == "completed"
    assert call["type"] == "function_call" and call["name"] == "get_time" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"zone": "CET"} and call["call_id"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1]


def test_a_call_cut_short_is_incomplete() -> None:
    """max_output_tokens inside a call's arguments: the call already announced stays, marked
    incomplete, and the text no complete call used follows as a message (the parsers' rule for
    streams: nothing sent is taken back), which is incomplete too."""
    items = ItemStream(EventWriter(), get_tool_parser("hermes").stream(), "msg_1")
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "C'
    chunks = [*items.begin(), *items.feed(text), *items.end("incomplete")]
    types = [json.loads(c.split("data: ", 1)[1])["type"] for c in chunks]
    assert types.count("response.output_item.done") == 2 and types[-1] == "response.output_item.done"
    call, message = items.items
    assert call["type"] == "function_call" and call["name"] == "get_time" and call["status"] == "incomplete"
    assert call["arguments"] == '{"zone": "C'
    assert message["content"][0]["text"] == text and message["status"] == "incomplete"
