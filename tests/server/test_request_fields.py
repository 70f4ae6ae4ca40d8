"""Every request field either works or is a 400 naming it, never silently ignored: vLLM's extras
(allowed_token_ids, truncate_prompt_tokens, prompt_logprobs, echo-only scoring with max_tokens 0,
beam search on /v1/completions) work; structured outputs and tools are refused until they land;
neutral values clients send routinely are accepted."""

from __future__ import annotations

import math
import re

import httpx
import pytest
from conftest import STORIES, hf_logprobs
from server_utils import RemoteServer, module_client, shared_server
from transformers import AutoTokenizer

PROMPT = "Once upon a time there was a little girl"
CHAT = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer):
    yield from shared_server(stories_server)  # the session's default-flags server


@pytest.fixture(scope="module")
def client(server: RemoteServer):
    yield from module_client(server)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(STORIES))


def _ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return resp.json()


def _error(resp: httpx.Response, field: str) -> dict:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == field and field in err["message"], err
    return err


REFUSED_CHAT = [
    ("guided_decoding_backend", "outlines"),
    ("use_beam_search", True),
    ("echo", True),
]


@pytest.mark.parametrize("field,value", REFUSED_CHAT, ids=[f for f, _ in REFUSED_CHAT])
def test_unsupported_chat_fields_are_400s_naming_them(client, field: str, value: object) -> None:
    err = _error(client.post("/v1/chat/completions", json={"messages": CHAT, field: value}), field)
    assert "not supported" in err["message"]


@pytest.mark.parametrize("field,value", [("guided_decoding_backend", "xgrammar"), ("priority", 1)])
def test_unsupported_completion_fields_are_400s_naming_them(client, field: str, value: object) -> None:
    _error(client.post("/v1/completions", json={"prompt": PROMPT, field: value}), field)


def test_unknown_fields_are_400s(client) -> None:
    for path, body in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": CHAT})):
        err = _error(client.post(path, json={**body, "max_tokenz": 3}), "max_tokenz")
        assert "Unknown field" in err["message"]
    _error(client.post("/v1/completions", json={"prompt": PROMPT, "tools": []}), "tools")  # a chat-only field


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    "messages",
    [
        [*CHAT, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}],  # no call before it
        [
            *CHAT,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_9", "content": "ok"},
        ],
    ],
    ids=["no call", "another call's id"],
)
def test_a_tool_result_for_no_call_is_a_400(client, messages: list[dict]) -> None:
    err = _error(
        client.post("/v1/chat/completions", json={"messages": messages}), f"messages.{len(messages) - 1}.tool_call_id"
    )
    assert "answers no tool call" in err["message"]
    answered = [
        *CHAT,
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    _ok(client.post("/v1/chat/completions", json={"messages": answered, "max_tokens": 2}))


def test_neutral_values_are_accepted(client) -> None:
    body = {
        "messages": CHAT,
        "max_tokens": 3,
        "tools": [],
        "tool_choice": "none",
        "functions": None,
        "response_format": {"type": "text"},
        "parallel_tool_calls": True,
        "store": False,
        "modalities": ["text"],
        "user": "u1",
        "stream_options": None,
    }
    _ok(client.post("/v1/chat/completions", json=body))


def test_allowed_token_ids(client, tok) -> None:
    allowed = sorted({tok.encode(w, add_special_tokens=False)[-1] for w in (" cat", " dog")})
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "allowed_token_ids": allowed}
    for path in ("/v1/completions", "/v1/chat/completions"):
        req = body if path == "/v1/completions" else {**body, "messages": CHAT, "prompt": None}
        req = {k: v for k, v in req.items() if v is not None}
        out = _ok(client.post(path, json=req))
        text = out["choices"][0]["text"] if "text" in out["choices"][0] else out["choices"][0]["message"]["content"]
        pieces = "|".join(re.escape(tok.convert_ids_to_tokens(a).replace("\u2581", " ")) for a in allowed)
        assert re.fullmatch(f"(?:{pieces})+", text), (text, pieces)
    _error(client.post("/v1/completions", json={**body, "allowed_token_ids": [100_000]}), "allowed_token_ids")


def test_truncate_prompt_tokens(client, tok) -> None:
    ids = tok.encode(PROMPT)
    greedy = {"max_tokens": 8, "temperature": 0}
    direct = _ok(client.post("/v1/completions", json={"prompt": ids[-5:], **greedy}))
    cut = _ok(client.post("/v1/completions", json={"prompt": PROMPT, "truncate_prompt_tokens": 5, **greedy}))
    assert cut["usage"]["prompt_tokens"] == 5
    assert cut["choices"][0]["text"] == direct["choices"][0]["text"]
    # A text over the context fits once truncated (its length alone is not refused).
    long = _ok(
        client.post("/v1/completions", json={"prompt": "hi " * 2000, "truncate_prompt_tokens": 50, "max_tokens": 2})
    )
    assert long["usage"]["prompt_tokens"] == 50


def test_prompt_logprobs_match_the_oracle(client, tok) -> None:
    ids = tok.encode(PROMPT)
    oracle = hf_logprobs(str(STORIES), ids)
    out = _ok(client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 2}))
    rows = out["choices"][0]["prompt_logprobs"]
    assert len(rows) == len(ids) and rows[0] is None
    for pos in range(1, len(ids)):
        entry = rows[pos][str(ids[pos])]
        assert math.isclose(entry["logprob"], oracle[pos - 1, ids[pos]].item(), abs_tol=1e-3)
        assert len(rows[pos]) <= 3
    chat = _ok(client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, "prompt_logprobs": 0}))
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 1
    _error(
        client.post("/v1/completions", json={"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}), "prompt_logprobs"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_zero_scores_the_prompt(client, tok, stream: bool) -> None:
    """What evaluation harnesses send for log-likelihoods: the prompt back, its logprobs, no completion."""
    ids = tok.encode(PROMPT)
    oracle = hf_logprobs(str(STORIES), ids)
    body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0, "stream": stream}
    if stream:
        with client.stream("POST", "/v1/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        import json

        chunks = [json.loads(e) for e in events[:-1]]
        usage = chunks[-1]["usage"]
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        text = "".join(c["text"] for c in choices)
        logprobs = [lp for c in choices if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]]
        finish = choices[-1]["finish_reason"]
    else:
        out = _ok(client.post("/v1/completions", json=body))
        usage, choice = out["usage"], out["choices"][0]
        text, logprobs, finish = choice["text"], choice["logprobs"]["token_logprobs"], choice["finish_reason"]
    assert text == PROMPT and finish == "length"
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == len(ids)
    assert len(logprobs) == len(ids) and logprobs[0] is None
    for pos in range(1, len(ids)):
        assert math.isclose(logprobs[pos], oracle[pos - 1, ids[pos]].item(), abs_tol=1e-3)


def test_max_tokens_zero_needs_echo(client) -> None:
    _error(client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0}), "max_tokens")


def test_beam_search_on_completions_matches_generate(client) -> None:
    body = {"prompt": PROMPT, "n": 3, "max_tokens": 6, "use_beam_search": True, "length_penalty": 0.5}
    legacy = _ok(client.post("/generate", json=body))
    out = _ok(client.post("/v1/completions", json={**body, "echo": True}))
    assert [c["text"] for c in out["choices"]] == legacy["text"]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    plain = _ok(client.post("/v1/completions", json=body))
    assert [PROMPT + c["text"] for c in plain["choices"]] == legacy["text"]
    assert plain["usage"]["completion_tokens"] > 0
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 2
    _error(client.post("/v1/completions", json={**body, "logprobs": 1}), "use_beam_search")
