"""`POST /v1/responses` on a real `tram serve` through the official `openai` SDK (and httpx for the raw
SSE): the SDK parses our objects and events; greedy text and token counts equal /v1/chat/completions
for the same conversation; streamed deltas add up to the final text; max_output_tokens ends a
response as incomplete; what the server cannot do is a 400 naming the field; a client that leaves
aborts its request. One server serves the module; every test must leave no KV block in use."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from conftest import STORIES
from prometheus_client.parser import text_string_to_metric_families
from server_utils import RemoteServer, settled_kv, shared_server

STORY = "Tell me a story"  # greedy: ends on its own (EOS) after ~230 tokens
LONG_STORY = "Tom and his dog"  # greedy: runs to the end of the 512-token context
GREEDY = {"model": STORIES, "temperature": 0}
EVENTS_BEFORE_TEXT = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
EVENTS_AFTER_TEXT = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def assert_idle(state: dict) -> None:
    assert state["blocks"]["in_use"] == 0 and state["num_running_reqs"] == 0, state
    assert state["num_waiting_reqs"] == 0 and state["num_unfinished_in_frontend"] == 0, state


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer):
    yield from shared_server(stories_server)  # the session's default-flags server
    state = settled_kv(stories_server)
    assert_idle(state)
    assert state["kv_cache_usage"] == 0, state


@pytest.fixture(autouse=True)
def no_kv_in_use(server: RemoteServer):
    yield
    assert_idle(settled_kv(server))


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def chat_reference(client: openai.OpenAI, messages: list[dict], max_tokens: int | None):
    return client.chat.completions.create(messages=messages, max_tokens=max_tokens, **GREEDY)


def assert_same_as_chat(resp, chat) -> None:
    """The response says what the chat endpoint said, with the same token counts and end."""
    (choice,) = chat.choices
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == STORIES
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    (part,) = item.content
    assert part.type == "output_text" and part.annotations == []
    assert part.text == resp.output_text == choice.message.content and part.text
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.total_tokens == chat.usage.total_tokens
    if choice.finish_reason == "length":
        assert resp.status == item.status == "incomplete"
        assert resp.incomplete_details.reason == "max_output_tokens"
    else:
        assert choice.finish_reason == "stop"
        assert resp.status == item.status == "completed" and resp.incomplete_details is None


INPUTS = {
    "string": ({"input": STORY}, [{"role": "user", "content": STORY}]),
    "messages": (
        {
            "input": [
                {"role": "system", "content": "You tell stories."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Tell me"}, {"type": "input_text", "text": "a story"}],
                },
            ]
        },
        [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me\na story"}],
    ),
    "instructions": (
        {
            "instructions": "Be kind.",
            "input": [
                {"role": "user", "content": STORY},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Once there was a cat."}]},
                {"role": "developer", "content": "Go on"},
            ],
        },
        [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": STORY},
            {"role": "assistant", "content": "Once there was a cat."},
            {"role": "developer", "content": "Go on"},
        ],
    ),
}


@pytest.mark.parametrize("max_tokens", [12, None], ids=["capped", "uncapped"])
@pytest.mark.parametrize("kind", list(INPUTS))
def test_greedy_equals_chat(client, kind, max_tokens):
    body, messages = INPUTS[kind]
    resp = client.responses.create(max_output_tokens=max_tokens, **GREEDY, **body)
    assert_same_as_chat(resp, chat_reference(client, messages, max_tokens))
    assert resp.instructions == body.get("instructions") and resp.max_output_tokens == max_tokens
    assert resp.temperature == 0 and resp.tools == [] and resp.text.format.type == "text"


def test_max_output_tokens_and_echoed_settings(client):
    resp = client.responses.create(input=STORY, max_output_tokens=5, metadata={"run": "a"}, user="u1", **GREEDY)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 5 and resp.output[0].status == "incomplete"
    assert resp.metadata == {"run": "a"} and resp.user == "u1" and resp.parallel_tool_calls is True
    full = client.responses.create(input=STORY, **GREEDY)
    assert full.status == "completed" and full.incomplete_details is None and full.usage.output_tokens > 5
    assert full.output_text.startswith(resp.output_text) and full.metadata == {}
    # The sampling values used are echoed: the request's, or the model's defaults (greedy has no top_p).
    sampled = client.responses.create(model=STORIES, input=STORY, max_output_tokens=3, temperature=0.5, top_p=0.5)
    assert (sampled.temperature, sampled.top_p) == (0.5, 0.5) and resp.top_p == 1.0
    default = client.responses.create(model=STORIES, input=STORY, max_output_tokens=3)
    assert (default.temperature, default.top_p) == (1.0, 1.0)


def test_earlier_output_sent_back_as_input(client):
    """The usual multi-turn pattern: the SDK's output items go back in `input` as they are."""
    first = client.responses.create(input=STORY, max_output_tokens=8, **GREEDY)
    follow_up = [{"role": "user", "content": STORY}, *first.output, {"role": "user", "content": "More"}]
    second = client.responses.create(input=follow_up, max_output_tokens=8, **GREEDY)
    messages = [
        {"role": "user", "content": STORY},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "More"},
    ]
    assert_same_as_chat(second, chat_reference(client, messages, 8))


def test_cached_tokens_are_reported(client):
    # A prompt of several 16-token blocks that nothing else sends: the second request finds all
    # of its full blocks in the prefix cache.
    text = " ".join(f"word{uuid.uuid4().hex[:6]}" for _ in range(12))
    first = client.responses.create(input=text, max_output_tokens=2, **GREEDY)
    second = client.responses.create(input=text, max_output_tokens=2, **GREEDY)
    n = first.usage.input_tokens
    assert n >= 32 and first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens == (n - 1) // 16 * 16


def sse_events(server: RemoteServer, body: dict) -> list[tuple[str, dict]]:
    """(event line, data) of each event; asserts the stream's framing on the way."""
    events: list[tuple[str, dict]] = []
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                assert name is not None, f"data without an event line: {line}"
                events.append((name, json.loads(line[len("data: ") :])))
                name = None
    return events


@pytest.mark.parametrize("max_tokens", [10, None], ids=["incomplete", "completed"])
def test_stream(server, client, max_tokens):
    full = client.responses.create(input=STORY, max_output_tokens=max_tokens, **GREEDY)
    events = list(client.responses.create(input=STORY, max_output_tokens=max_tokens, stream=True, **GREEDY))
    types = [e.type for e in events]
    n_deltas = types.count("response.output_text.delta")
    terminal = "response.completed" if max_tokens is None else "response.incomplete"
    assert types == EVENTS_BEFORE_TEXT + ["response.output_text.delta"] * n_deltas + EVENTS_AFTER_TEXT + [terminal]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # DELTA outputs a slow reader missed arrive merged, so how many deltas varies; none is empty.
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert n_deltas >= 1 and all(deltas)
    text = "".join(deltas)
    final = events[-1].response
    assert text == full.output_text == final.output_text == events[-4].text
    assert events[-3].part.text == text and events[-2].item.content[0].text == text
    assert final.status == full.status and final.usage.output_tokens == full.usage.output_tokens
    assert final.usage.input_tokens == full.usage.input_tokens
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    ids = {e.item_id for e in events if hasattr(e, "item_id")} | {events[2].item.id, final.output[0].id}
    assert len(ids) == 1 and events[0].response.id == final.id
    # The raw stream: an `event:` line naming each event's type, and no `[DONE]` (as OpenAI and vLLM).
    raw = sse_events(server, {"input": STORY, "max_output_tokens": max_tokens, **GREEDY})
    assert [name for name, _ in raw] == [data["type"] for _, data in raw] and raw[-1][0] == terminal


def test_sdk_stream_helper(client):
    """The SDK's own accumulation (strict about ids and item order) rebuilds the same response."""
    with client.responses.stream(input=STORY, **GREEDY) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.output_text == client.responses.create(input=STORY, **GREEDY).output_text


UNSUPPORTED = [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),  # OpenAI's built-in tools
    ({"tool_choice": "required"}, "tool_choice"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"background": True}, "background"),
    ({"text": {"format": {"type": "grammar", "grammar": 'root ::= "a"'}}}, "text.format"),
    # Supported, but this schema is not one the grammar engine takes: refused before any event too.
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}}, "text.format"),
    ({"prompt_cache_key": "k"}, "prompt_cache_key"),  # a field this server does not know at all
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("extra,field", UNSUPPORTED, ids=[f for _, f in UNSUPPORTED])
def test_unsupported_field_is_400_naming_it(server, extra, field, stream):
    # A streamed request is refused with the status too, before any event.
    body = {"model": STORIES, "input": STORY, "stream": stream, **extra}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"] and err["type"] == "invalid_request_error", err


@pytest.mark.parametrize(
    "item,words",
    [
        ({"type": "function_call_output", "call_id": "c", "output": "x"}, ["input[0]", "function_call_output"]),
        (
            {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]},
            ["input[0].content[0]", "input_image"],
        ),
        ({"role": "tool", "content": "x"}, ["input[0].role"]),
    ],
)
def test_unsupported_input_is_400(client, item, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=STORIES, input=[item])
    assert e.value.body["param"] == "input" and all(w in e.value.body["message"] for w in words), e.value.body


def test_bad_values_are_4xx(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=STORIES, input="hi " * 600)
    assert e.value.code == "context_length_exceeded" and e.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=STORIES, input=STORY, max_output_tokens=600)
    assert e.value.body["param"] == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=STORIES, input=STORY, temperature=3)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input=STORY)


def metric(server: RemoteServer, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    found = [
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and set(labels.items()) <= set(s.labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_client_disconnect_aborts(server):
    """Leaving a streamed or a plain request aborts it: neither runs to its end."""
    finished = {r: metric(server, "tram:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")}
    body = {"input": LONG_STORY, "max_output_tokens": 480, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=30) as r:
        assert any(line == "event: response.output_text.delta" for line in r.iter_lines())
    with pytest.raises(httpx.ReadTimeout):  # 480 tokens take ~0.3 s on a quiet machine, the timeout a third
        httpx.post(server.url + "/v1/responses", json=body, timeout=0.1)
    assert_idle(settled_kv(server))
    after = {r: metric(server, "tram:request_success_total", finished_reason=r) for r in finished}
    assert after == {**finished, "abort": finished["abort"] + 2}, (finished, after)
