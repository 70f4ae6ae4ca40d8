"""Structured outputs and tool calling end to end, through the official `openai` SDK against a real
`tram serve` (xgrammar): response_format json_schema / json_object, structured_outputs and guided_*
choice / regex / grammar on both endpoints, forced tool calls streamed and whole, parse() with a
pydantic model, the 400s naming the field at fault (before any stream starts), n > 1, a compile
that times out failing alone, 64 mixed requests at once, and the Prometheus counters.

Every schema is bounded (see structured_cases.py: the tiny model never ends a JSON text by itself),
and "required" tool choices use parallel_tool_calls=False (else the model writes calls until
max_tokens). One server serves the module; after every test no request is left and no KV block is
in use.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from typing import Any, Literal

import httpx
import openai
import pytest
from conftest import STORIES
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field
from server_pool import ServerSpec
from server_utils import RemoteServer, openai_module_fixtures, wait_state
from structured_cases import (
    MESSAGES,
    PERSON,
    PROMPT,
    REGEX,
    SEEDED,
    SHOPPING,
    chat,
    closed_object,
    json_schema_format,
    json_schema_round,
    stream_chat,
    stream_completion,
    valid,
)

GREEDY = {"temperature": 0.0}
# A compile limit far above what the bounded schemas here take on the 512-token vocabulary (a few
# ms) and far below the deeply nested schema of test_compile_timeout_fails_alone (~14 s).
COMPILE_TIMEOUT_S = 1

WEATHER = closed_object(city={"type": "string", "maxLength": 8}, unit={"enum": ["c", "f"]})
CLOCK = closed_object(zone={"enum": ["UTC", "CET", "PST"]})
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.", "parameters": CLOCK}},
]
TOOL_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

CHOICES = ["sunny", "rainy", "cloudy with a chance of meatballs"]
GRAMMAR = 'root ::= ("yes" | "no") " " [0-9]'
GRAMMAR_MATCH = r"(yes|no) [0-9]"


class Pet(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=20)
    kind: Literal["cat", "dog"]


SERVER = ServerSpec(
    STORIES,
    ("--structured-outputs-disable-any-whitespace", "--structured-outputs-compile-timeout", str(COMPILE_TIMEOUT_S)),
)
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)
server, client, no_kv_in_use = openai_module_fixtures(SERVER)


# ---- response_format ---------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [SEEDED, GREEDY], ids=["seeded", "greedy"])
def test_json_schema_streamed_equals_whole(client, sampling: dict) -> None:
    json_schema_round(client, PERSON, **sampling)


@pytest.mark.parametrize("sampling", [SEEDED, GREEDY], ids=["seeded", "greedy"])
def test_guided_json_completion_streamed_equals_whole(client, sampling: dict) -> None:
    kw = {"prompt": PROMPT, "max_tokens": 100, "extra_body": {"guided_json": SHOPPING}, **sampling}
    whole = client.completions.create(model=STORIES, **kw).choices[0]
    assert whole.finish_reason == "stop", whole
    valid(whole.text, SHOPPING)
    assert stream_completion(client, **kw) == (whole.text, "stop")


def test_json_object(client) -> None:
    # Any JSON object, but stories260K never closes one by itself: its keys and values are story
    # text, and after each value '}' (the byte token <0x7D>, id 128) loses to ',' by some 20 nats,
    # so it writes members until max_tokens (300 tokens, 8 seeds: none closed). A bias on '"' (436)
    # keeps the strings short and one on '}' lets the object end: with these, 40 seeds out of 40
    # closed within 33 tokens (about half of them non-empty objects); max_tokens 100 leaves room.
    # The grammar still does all the rest: only it makes the text JSON.
    for seed in range(4):
        out = chat(
            client,
            response_format={"type": "json_object"},
            max_tokens=100,
            temperature=0.8,
            seed=seed,
            logit_bias={"436": 6, "128": 20},
        ).choices[0]
        assert out.finish_reason == "stop", out
        assert isinstance(json.loads(out.message.content), dict), out.message.content


# ---- choice, regex, grammar --------------------------------------------------------------------

CONSTRAINTS = [
    ("structured_outputs", {"choice": CHOICES}, lambda t: t in CHOICES),
    ("guided_choice", CHOICES, lambda t: t in CHOICES),
    ("structured_outputs", {"regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
    ("guided_regex", REGEX, lambda t: re.fullmatch(REGEX, t)),
    ("structured_outputs", {"grammar": GRAMMAR}, lambda t: re.fullmatch(GRAMMAR_MATCH, t)),
    ("guided_grammar", GRAMMAR, lambda t: re.fullmatch(GRAMMAR_MATCH, t)),
]


@pytest.mark.parametrize(
    "field,value,check",
    CONSTRAINTS,
    ids=["so-choice", "guided_choice", "so-regex", "guided_regex", "so-grammar", "guided_grammar"],
)
def test_choice_regex_grammar(client, field: str, value: Any, check) -> None:
    for seed in (1, 2):
        kw = {"max_tokens": 40, "temperature": 0.8, "seed": seed, "extra_body": {field: value}}
        text = client.completions.create(model=STORIES, prompt=PROMPT, **kw).choices[0].text
        assert check(text), text
        assert stream_completion(client, prompt=PROMPT, **kw) == (text, "stop")
        content = chat(client, **kw).choices[0].message.content
        assert check(content), content
        assert stream_chat(client, **kw) == (content, "stop")


# ---- tools -------------------------------------------------------------------------------------

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def check_calls(calls: list[dict], expect_name: str | None) -> None:
    """One call (named, or "required" without parallel calls), of a tool that exists, with arguments
    its parameters accept, and an id."""
    assert len(calls) == 1, calls
    call = calls[0]
    assert call["id"] and call["type"] == "function", call
    name = call["function"]["name"]
    assert name in TOOL_PARAMS and name == (expect_name or name), call
    valid(call["function"]["arguments"], TOOL_PARAMS[name])


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_forced_tool_call(client, tool_choice) -> None:
    kw = {"tools": TOOLS, "tool_choice": tool_choice, "parallel_tool_calls": False, "max_tokens": 100, **SEEDED}
    choice = chat(client, **kw).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content, choice
    whole = [c.model_dump() for c in choice.message.tool_calls]
    expect = "get_weather" if tool_choice == NAMED else None
    check_calls(whole, expect)

    # Streamed: the first fragment of each call carries its id, type and name; the argument
    # fragments add up to the same arguments (same seed); the last finish_reason is "tool_calls".
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chat(client, stream=True, **kw):
        for c in chunk.choices:
            assert not c.delta.content, c
            for frag in c.delta.tool_calls or []:
                if frag.index not in calls:
                    assert frag.id and frag.type == "function" and frag.function.name, frag
                    calls[frag.index] = {
                        "id": frag.id,
                        "type": "function",
                        "function": {"name": frag.function.name, "arguments": ""},
                    }
                else:
                    assert frag.id is None and not (frag.function and frag.function.name), frag
                calls[frag.index]["function"]["arguments"] += (frag.function and frag.function.arguments) or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    streamed = [calls[i] for i in sorted(calls)]
    check_calls(streamed, expect)
    assert [c["function"] for c in streamed] == [c["function"] for c in whole]


def test_conversation_with_tool_results(client) -> None:
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    out = chat(client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=10)
    assert out.choices[0].message.content
    # And with a forced call after it.
    out = chat(client, messages=messages, tools=TOOLS, tool_choice=NAMED, max_tokens=100, **SEEDED)
    check_calls([c.model_dump() for c in out.choices[0].message.tool_calls], "get_weather")


def test_parse_pydantic_model(client) -> None:
    out = client.chat.completions.parse(model=STORIES, messages=MESSAGES, response_format=Pet, max_tokens=100, **SEEDED)
    message = out.choices[0].message
    assert isinstance(message.parsed, Pet), message
    assert message.parsed == Pet.model_validate_json(message.content)


def test_n2_choices_all_valid(client) -> None:
    out = chat(client, response_format=json_schema_format(PERSON), n=2, max_tokens=100, **SEEDED)
    assert sorted(c.index for c in out.choices) == [0, 1]
    for c in out.choices:
        assert c.finish_reason == "stop"
        valid(c.message.content, PERSON)
    out = client.completions.create(
        model=STORIES, prompt=PROMPT, n=2, max_tokens=100, extra_body={"guided_json": PERSON}, **SEEDED
    )
    assert len(out.choices) == 2
    for c in out.choices:
        valid(c.text, PERSON)


# ---- errors ------------------------------------------------------------------------------------

BOGUS = {"type": "bogus"}
ERRORS = [  # (extra request fields, the field the 400 names)
    ({"response_format": json_schema_format(BOGUS)}, "response_format"),
    ({"guided_json": BOGUS}, "guided_json"),
    ({"structured_outputs": {"json": BOGUS}}, "structured_outputs"),
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs"),
    ({"guided_regex": REGEX, "guided_choice": CHOICES}, "guided_choice"),
    ({"structured_outputs": {"regex": REGEX}, "response_format": json_schema_format(PERSON)}, "response_format"),
]
TOOL_ERRORS = [
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}},
    {"tools": TOOLS, "tool_choice": "auto"},  # the server has no --enable-auto-tool-choice
    {"tool_choice": "required"},  # no tools
    {"tools": TOOLS, "tool_choice": "required", "response_format": json_schema_format(PERSON)},
]


def assert_400(param: str, call) -> openai.BadRequestError:
    """A 400 naming `param`; for a stream the SDK raises it at create(), so it came before any event."""
    with pytest.raises(openai.BadRequestError) as info:
        call()
    assert info.value.status_code == 400 and info.value.param == param, info.value.body
    return info.value


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_invalid_constraints_are_400s(client, stream: bool) -> None:
    for extra, param in ERRORS:
        assert_400(
            param,
            lambda: client.completions.create(
                model=STORIES, prompt=PROMPT, max_tokens=5, stream=stream, extra_body=extra
            ),
        )
        assert_400(param, lambda: chat(client, max_tokens=5, stream=stream, extra_body=extra))
    for extra in TOOL_ERRORS:
        assert_400("tool_choice", lambda: chat(client, max_tokens=5, stream=stream, extra_body=extra))
    # The server goes on serving; the autouse fixture checks that no KV block leaked.
    kw = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    whole = client.completions.create(model=STORIES, **kw).choices[0]
    assert whole.text and whole.finish_reason == "length"
    assert stream_completion(client, **kw) == (whole.text, "length")


# ---- 64 requests at once ------------------------------------------------------------------------

LOAD_SCHEMAS = [PERSON, WEATHER, CLOCK, SHOPPING]
LOAD_PROMPTS = [
    PROMPT,
    "Tom and his dog",
    "The little bird",
    "Lily wanted to",
    "One day, a big",
    "The sun was",
    "Sam had a red ball",
    "In the park",
]
FREE_TOKENS = 24


def test_legacy_generate_and_beam_search(server: RemoteServer) -> None:
    """vLLM's /generate takes `structured_outputs` like any SamplingParams field; beam search cannot
    honour a grammar, so asking for both is a 400 (never an unconstrained answer)."""
    body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "structured_outputs": {"regex": REGEX}}
    r = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert re.fullmatch(REGEX, r.json()["text"][0][len(PROMPT) :])
    bad = httpx.post(
        server.url + "/generate", json={**body, "stream": True, "structured_outputs": {"regex": "(ab"}}, timeout=60
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "structured_outputs"
    completion = {"prompt": PROMPT, "max_tokens": 30, "guided_regex": REGEX}
    for path, request in (
        ("/generate", {**body, "use_beam_search": True, "n": 2}),
        ("/v1/completions", {**completion, "use_beam_search": True, "n": 2}),
    ):
        r = httpx.post(server.url + path, json=request, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_search", r.text


def test_mixed_load(server: RemoteServer, client) -> None:
    """32 constrained chats (4 schemas in turn, sampled) and 32 greedy completions at once: every
    constrained output validates, and every free one is token for token what it is alone."""
    free_kw = {"max_tokens": FREE_TOKENS, "temperature": 0, "logprobs": 1, "extra_body": {"ignore_eos": True}}

    def tokens(choice) -> tuple[str, list[str]]:
        return choice.text, choice.logprobs.tokens

    alone = {p: tokens(client.completions.create(model=STORIES, prompt=p, **free_kw).choices[0]) for p in LOAD_PROMPTS}
    assert all(len(toks) == FREE_TOKENS for _, toks in alone.values())

    async def run() -> tuple[list, list]:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        async with aclient:
            constrained = [
                aclient.chat.completions.create(
                    model=STORIES,
                    messages=MESSAGES,
                    response_format=json_schema_format(LOAD_SCHEMAS[i % 4], f"s{i % 4}"),
                    max_tokens=100,
                    temperature=0.8,
                    seed=i,
                )
                for i in range(32)
            ]
            free = [
                aclient.completions.create(model=STORIES, prompt=LOAD_PROMPTS[i % len(LOAD_PROMPTS)], **free_kw)
                for i in range(32)
            ]
            # Interleaved, so constrained and free requests arrive (and run) together.
            results = await asyncio.gather(*[r for pair in zip(constrained, free) for r in pair])
        return results[0::2], results[1::2]

    constrained, free = asyncio.run(run())
    for i, out in enumerate(constrained):
        assert out.choices[0].finish_reason == "stop", out
        valid(out.choices[0].message.content, LOAD_SCHEMAS[i % 4])
    for i, out in enumerate(free):
        c = out.choices[0]
        assert c.finish_reason == "length" and out.usage.completion_tokens == FREE_TOKENS, out
        assert tokens(c) == alone[LOAD_PROMPTS[i % len(LOAD_PROMPTS)]], i


# ---- metrics -----------------------------------------------------------------------------------

SO_METRICS = (
    "tram:structured_output_requests_total",
    "tram:grammar_compile_seconds_count",
    "tram:grammar_compile_failures_total",
    "tram:grammar_cache_hits_total",
)


def so_metrics(server: RemoteServer) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    totals = dict.fromkeys(SO_METRICS, 0.0)
    seen = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in totals:
                totals[s.name] += s.value
                seen.add(s.name)
    assert seen == set(SO_METRICS), f"structured-output metrics missing from /metrics: {set(SO_METRICS) - seen}"
    return totals


def test_prometheus_metrics(server: RemoteServer, client) -> None:
    before = so_metrics(server)
    schema = {**CLOCK, "description": "a schema no other test uses, so its first compile is a miss"}
    with pytest.raises(openai.BadRequestError):
        chat(client, max_tokens=5, extra_body={"guided_regex": "(unclosed"})
    for _ in range(2):  # a compile, then a cache hit
        valid(
            chat(client, response_format=json_schema_format(schema), max_tokens=100, **SEEDED)
            .choices[0]
            .message.content,
            schema,
        )
    want = {
        "tram:structured_output_requests_total": 3,
        "tram:grammar_compile_seconds_count": 2,
        "tram:grammar_compile_failures_total": 1,
        "tram:grammar_cache_hits_total": 1,
    }
    deadline = time.monotonic() + 10  # the counters follow the engine's stats, which come with its outputs
    while True:
        grown = {k: v - before[k] for k, v in so_metrics(server).items()}
        if all(grown[k] >= n for k, n in want.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(grown[k] >= n for k, n in want.items()), grown


# ---- a compile that takes too long (last: its compile goes on in the engine core's background) ----


def nested_one_of(depth: int) -> dict:
    x: dict = {"type": "integer"}
    for _ in range(depth):
        x = {"oneOf": [{"type": "object", "properties": {"a": x, "b": x}}, {"type": "array", "items": x}]}
    return x


def test_compile_timeout_fails_alone(server: RemoteServer, client) -> None:
    """A schema xgrammar takes ~14 s to compile (depth 8; depth 7 takes ~1-2 s) fails with a 400 once
    the 1 s limit passes, long before the compile ends; a plain request that runs meanwhile, and a
    new small grammar after it, are served as usual."""
    deep = nested_one_of(8)
    failed: dict[str, Any] = {}

    def send_deep() -> None:
        start = time.monotonic()
        try:
            client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=5, extra_body={"guided_json": deep})
        except openai.BadRequestError as e:
            failed["error"] = e
        failed["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=send_deep)
    thread.start()
    # Once the deep request waits in the engine for its grammar, a plain one runs beside it.
    waiting = wait_state(server, lambda state: state["num_waiting_reqs"] >= 1 or not thread.is_alive(), 10)
    plain = client.completions.create(
        model=STORIES, prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
    )
    thread.join(60)
    assert not thread.is_alive()
    assert waiting["num_waiting_reqs"] >= 1, (waiting, failed)
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 16, plain
    error = failed.get("error")
    assert error is not None and error.param == "guided_json", failed
    assert "too long" in error.message and "--structured-outputs-compile-timeout" in error.message, error.message
    # Well before the compile itself could end (a loose bound: the limit is 1 s).
    assert failed["seconds"] < 8, failed

    # Streamed, asking through another field: a 400 before any event, naming that field, though the
    # request shares the compile still running (it gets a deadline of its own).
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, max_tokens=5, stream=True, response_format=json_schema_format(deep))
    assert info.value.param == "response_format" and "too long" in info.value.message, info.value.body

    # The compile goes on in one of the two compile threads; the other takes new grammars.
    text = (
        client.completions.create(
            model=STORIES, prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"guided_regex": "[0-9]{4}"}
        )
        .choices[0]
        .text
    )
    assert re.fullmatch("[0-9]{4}", text), text
