"""`tram serve --speculative-config '{...}'`: streamed and whole completions equal the server without
speculation (the session's shared one), several tokens may arrive in one delta, and /metrics counts
drafts and accepted tokens as vLLM names them."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import STORIES
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer, module_client, shared_server

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
SERVER = ServerSpec(STORIES, ("--speculative-config", NGRAM), (("TRAM_SPEC_DRAFT_SWITCH", "0"),))
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)
OPENING = "Once upon a time"


@pytest.fixture(scope="module")
def server():
    yield from pool_server(SERVER)


@pytest.fixture(scope="module")
def client(server: RemoteServer):
    yield from module_client(server, 60)


@pytest.fixture(scope="module")
def plain(stories_server: RemoteServer):
    yield from shared_server(stories_server)


@pytest.fixture(scope="module")
def prompt(plain: RemoteServer) -> str:
    """A story the model told, then its opening again: the continuation retells it (drafts hold)."""
    body = {"model": STORIES, "prompt": OPENING, "max_tokens": 80, "temperature": 0}
    with httpx.Client(base_url=plain.url, timeout=60) as other:
        story = other.post("/v1/completions", json=body).json()["choices"][0]["text"]
    return f"{OPENING}{story}\n{OPENING}"


def _metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith(name + "_created")
    )


def test_completions_match_and_metrics_count_drafts(client, plain, prompt):
    body = {"model": STORIES, "prompt": prompt, "max_tokens": 60, "temperature": 0}
    before = client.get("/metrics").text
    got = client.post("/v1/completions", json=body).json()["choices"][0]
    with httpx.Client(base_url=plain.url, timeout=60) as other:
        want = other.post("/v1/completions", json=body).json()["choices"][0]
    assert (got["text"], got["finish_reason"]) == (want["text"], want["finish_reason"])
    after = client.get("/metrics").text
    drafts = _metric(after, "tram:spec_decode_num_drafts") - _metric(before, "tram:spec_decode_num_drafts")
    accepted = _metric(after, "tram:spec_decode_num_accepted_tokens_total") - _metric(
        before, "tram:spec_decode_num_accepted_tokens_total"
    )
    assert drafts > 0 and accepted > 0
    per_pos = _metric(after, "tram:spec_decode_num_accepted_tokens_per_pos")
    assert per_pos == _metric(after, "tram:spec_decode_num_accepted_tokens_total")


def test_stream_carries_several_tokens_per_delta_and_the_same_text(client, plain, prompt):
    body = {"model": STORIES, "prompt": prompt, "max_tokens": 60, "temperature": 0, "stream": True}
    texts = []
    with client.stream("POST", "/v1/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                texts.append(json.loads(line[6:])["choices"][0]["text"])
    with httpx.Client(base_url=plain.url, timeout=60) as other:
        want = other.post("/v1/completions", json={**body, "stream": False}).json()["choices"][0]["text"]
    assert "".join(texts) == want
    assert len([t for t in texts if t]) < 60, "accepted drafts arrive together"


TOY = {
    "type": "object",
    "properties": {"toys": {"type": "array", "items": {"enum": ["ball", "red ball"]}, "maxItems": 5}},
    "required": ["toys"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "play", "parameters": TOY}}
CONSTRAINED = {
    "schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "toys", "schema": TOY}}},
    "tool": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "play"}}},
}


@pytest.mark.parametrize("kind", CONSTRAINED)
def test_constrained_chat_is_drafted_and_unchanged(client, plain, kind):
    """A JSON schema and a forced tool call: the grammar's drafts verified under their masks give the
    plain server's message, greedy and for seeded samples, each valid."""
    messages = [{"role": "user", "content": "Tom had a red ball. Tom had a red ball. What toys did Tom have?"}]
    bodies = [
        {"model": STORIES, "messages": messages, "max_tokens": 80, "temperature": 0, **CONSTRAINED[kind]},
        {"model": STORIES, "messages": messages, "max_tokens": 80, "n": 4, "seed": 5, **CONSTRAINED[kind]},
    ]
    before = _metric(client.get("/metrics").text, "tram:spec_decode_num_accepted_tokens_total")
    for body in bodies:
        got = client.post("/v1/chat/completions", json=body).json()["choices"]
        with httpx.Client(base_url=plain.url, timeout=60) as other:
            want = other.post("/v1/chat/completions", json=body).json()["choices"]
        assert [_without_ids(c["message"]) for c in got] == [_without_ids(c["message"]) for c in want]
        for choice in got:
            msg = choice["message"]
            text = msg["content"] if kind == "schema" else msg["tool_calls"][0]["function"]["arguments"]
            if choice["finish_reason"] != "length":
                assert set(json.loads(text)) == {"toys"}, text
    assert _metric(client.get("/metrics").text, "tram:spec_decode_num_accepted_tokens_total") > before


def _without_ids(message: dict) -> dict:
    calls = [{k: v for k, v in call.items() if k != "id"} for call in message.get("tool_calls") or ()]
    return {**message, "tool_calls": calls}
