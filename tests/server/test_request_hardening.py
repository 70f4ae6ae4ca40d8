"""Requests that once broke the server: integers beyond 64 bits that leaked a registered request
(and with --max-queued-requests locked everyone out), deeply nested JSON, lone surrogates, empty
roles, methods without an Allow header. And the property behind the leak fix: whatever mix of valid
and invalid requests, aborts and disconnects, the front end's and the core's request counts return
to zero and no KV block stays in use."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from conftest import STORIES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer, is_idle, module_client, settled_kv

HUGE = 10**30
# A queue of 2: a single leaked request per slot would turn into 429s for everyone.
SERVER = ServerSpec(STORIES, ("--max-queued-requests", "2", "--max-num-seqs", "4"))
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)


@pytest.fixture(scope="module")
def server():
    yield from pool_server(SERVER)


@pytest.fixture(scope="module")
def client(server: RemoteServer):
    yield from module_client(server, 60)


def _error(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    return resp.json()["error"]


OVERSIZED = [
    ("/v1/completions", {"prompt": "Once upon", "top_k": HUGE}, "top_k"),
    ("/v1/completions", {"prompt": "Once upon", "min_tokens": HUGE, "max_tokens": None}, "min_tokens"),
    ("/v1/completions", {"prompt": "Once upon", "stream": True, "top_k": HUGE}, "top_k"),
    ("/v1/completions", {"prompt": "Once upon", "stop_token_ids": [2**64]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "Once upon", "seed": 2**64}, "seed"),
    ("/v1/completions", {"prompt": "Once upon", "logit_bias": {str(HUGE): 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "min_tokens": HUGE}, "min_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True, "top_k": HUGE}, "top_k"),
    ("/generate", {"prompt": "Once upon", "top_k": HUGE}, "top_k"),
    ("/generate", {"prompt": "Once upon", "min_tokens": HUGE}, "min_tokens"),
    ("/generate", {"prompt": "Once upon", "stream": True, "seed": -(2**64)}, "seed"),
    # n samples are fanned out in the API process: a billion of them once took it to 23 GB and the OOM killer.
    ("/generate", {"prompt": "f", "n": 1003811452}, "n"),
    ("/v1/completions", {"prompt": "Once upon", "n": 5}, "n"),  # more than --max-num-seqs 4
    # A schema crosses to the engine core as msgpack (64-bit integers): once a 500 from an OverflowError.
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "guided_json": {"type": "array", "items": [2**77]}},
        "guided_json",
    ),
]


@pytest.mark.parametrize("path,body,field", OVERSIZED, ids=[f"{p}-{f}" for p, _, f in OVERSIZED])
def test_integers_beyond_64_bits_are_400s_naming_the_field(client, server, path, body, field) -> None:
    err = _error(client.post(path, json=body))
    assert field in err["message"] and err["param"].split(".")[0] == field, err
    assert server.kv_state()["num_unfinished_in_frontend"] == 0


def test_oversized_integers_never_fill_the_queue(client, server) -> None:
    """The original defect: six such requests used to leave six registered requests behind, and a
    queue of two then answered 429 to every later client."""
    for _ in range(3):
        for path, body, _ in OVERSIZED[:6]:
            assert client.post(path, json=body).status_code == 400
    ok = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200, ok.text
    assert is_idle(settled_kv(server, 20))


def test_deeply_nested_json_is_a_400_everywhere(client) -> None:
    nested = "[" * 10_000 + "]" * 10_000
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/tokenize"):
        body = '{"prompt": ' + nested + "}"
        resp = client.post(path, content=body, headers={"content-type": "application/json"})
        _error(resp)


@pytest.mark.parametrize(
    "body",
    ["{not json", "[1, 2]", '"text"', "null", '{"prompt": 5}', '{"prompt": ""}', '{"prompt": "hi", "bogus_field": 1}'],
)
def test_generate_refuses_malformed_bodies(client, body: str) -> None:
    _error(client.post("/generate", content=body, headers={"content-type": "application/json"}))


def test_generate_has_a_body_schema(client) -> None:
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/generate"]["post"]
    schema_ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][schema_ref.rsplit("/", 1)[-1]]
    assert {"prompt", "max_tokens", "temperature", "use_beam_search"} <= set(schema["properties"])
    assert schema.get("additionalProperties") is False
    for path_ops in doc["paths"].values():
        for operation in path_ops.values():
            assert "422" not in operation["responses"]
    assert "400" in op["responses"]


def test_lone_surrogates_are_a_clear_400(client) -> None:
    body = '{"prompt": "Once \\ud800 upon", "max_tokens": 2}'
    err = _error(client.post("/v1/completions", content=body, headers={"content-type": "application/json"}))
    assert "surrogate" in err["message"] and err["param"] == "prompt", err
    chat = '{"messages": [{"role": "user", "content": "\\udfff"}]}'
    err = _error(client.post("/v1/chat/completions", content=chat, headers={"content-type": "application/json"}))
    assert "surrogate" in err["message"], err
    # A message that quotes the client's bad value must still be valid UTF-8 JSON.
    resp = client.post(
        "/v1/completions", content='{"prompt": "x", "model": "\\ud800"}', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 404 and json.loads(resp.content)["error"]


def test_an_empty_chat_role_is_refused(client) -> None:
    err = _error(client.post("/v1/chat/completions", json={"messages": [{"role": "", "content": "hi"}]}))
    assert err["param"] == "messages.0.role", err


def test_wrong_method_gets_405_with_allow(client) -> None:
    resp = client.request("TRACE", "/v1/completions")
    assert resp.status_code == 405 and "POST" in resp.headers["allow"], resp.headers
    assert resp.json()["error"]["message"]


def test_health_is_json(client) -> None:
    resp = client.get("/health")
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert resp.json() == {"status": "ok"}


# ------------------------------------------------------------------------ the property behind it

VALID = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.7, "seed": 1}
INVALID = [
    ("/v1/completions", {**VALID, "top_k": HUGE}),
    ("/v1/completions", {**VALID, "n": 2, "min_tokens": HUGE}),
    ("/v1/completions", {**VALID, "prompt": "hi " * 600}),  # over the context
    ("/v1/completions", {**VALID, "prompt": [[1, 2], [100_000]]}),  # second prompt out of vocabulary
    ("/v1/completions", {**VALID, "guided_regex": "(ab"}),  # refused by the engine core, after submission
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999": 1}}),
    ("/generate", {"prompt": "hi", "logprobs": 10_000}),
]
op = st.one_of(
    st.tuples(st.just("valid"), st.booleans(), st.integers(1, 2)),  # (kind, stream, n)
    st.tuples(st.just("invalid"), st.integers(0, len(INVALID) - 1)),
    st.tuples(st.just("disconnect"), st.integers(0, 3)),  # stream, leave after k chunks
    st.tuples(st.just("timeout"), st.floats(0.01, 0.3)),  # non-streamed, the client gives up
)


async def _run(client: httpx.AsyncClient, action: tuple) -> None:
    kind = action[0]
    if kind == "valid":
        resp = await client.post("/v1/completions", json={**VALID, "stream": action[1], "n": action[2]})
        assert resp.status_code in (200, 429), resp.text
    elif kind == "invalid":
        path, body = INVALID[action[1]]
        resp = await client.post(path, json=body)
        assert resp.status_code in (400, 429), resp.text
    elif kind == "disconnect":
        body = {**VALID, "max_tokens": 64, "stream": True, "ignore_eos": True}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            seen = 0
            async for _ in resp.aiter_lines():
                seen += 1
                if seen > action[1]:
                    break
    else:
        try:
            await client.post(
                "/v1/completions", json={**VALID, "max_tokens": 200, "ignore_eos": True}, timeout=action[1]
            )
        except httpx.TimeoutException:
            pass


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(op, min_size=1, max_size=6))
def test_request_counts_return_to_zero(server: RemoteServer, actions: list[tuple]) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            await asyncio.gather(*(_run(client, a) for a in actions))

    asyncio.run(main())
    state = settled_kv(server, 20)
    assert is_idle(state), (actions, state)
