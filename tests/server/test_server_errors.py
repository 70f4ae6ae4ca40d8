"""Bad requests against a real `tram serve`: each gets the right 4xx status and an OpenAI error body
{"error": {"message", "type", "param", "code"}}, never a 500, and the server (and the client's
keep-alive connection) goes on serving afterwards. Also auth (--api-key) and queue overload (429)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.client import HTTPConnection

import httpx
import openai
import pytest
from conftest import STORIES
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer, is_idle, shared_server, wait_state

KEY = "sekret"
TINY = "tiny"  # --served-model-name of the guarded server
OOV = 100_000  # a token id far outside stories260K's 512-token vocabulary
LONG_TEXT = "hi " * 600  # well over the 512-token context
GUARDED = ServerSpec(
    STORIES, ("--api-key", KEY, "--max-num-seqs", "1", "--max-queued-requests", "1", "--served-model-name", TINY)
)
SERVERS = (GUARDED,)  # started a module ahead (server_pool.py); `server` is the session's


# ---------------------------------------------------------------------------------------- helpers


def assert_error(resp: httpx.Response, status: int, *words: str) -> dict:
    """`resp` is `status` with an OpenAI error body whose message contains each of `words`."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    for w in words:
        assert w.lower() in err["message"].lower(), (w, err)
    return err


def assert_sdk_error(exc: openai.APIStatusError, status: int, *words: str) -> dict:
    assert exc.status_code == status, exc
    return assert_error(exc.response, status, *words)


def same_connection(
    server: RemoteServer, requests: list[tuple[str, str, dict | bytes | None]], headers: dict[str, str] | None = None
) -> list[tuple[int, dict]]:
    """Send (method, path, json body or raw bytes) requests one after another on ONE keep-alive connection; return
    (status, json) of each. Unlike httpx's pool, http.client does not quietly reconnect when the server
    closed the connection after an error response: the next request fails with RemoteDisconnected."""
    conn = HTTPConnection("127.0.0.1", server.port, timeout=60)
    results = []
    try:
        for method, path, body in requests:
            data = body if body is None or isinstance(body, bytes) else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            raw = resp.read()
            assert (resp.getheader("connection") or "").lower() != "close", (path, body, resp.status, raw)
            results.append((resp.status, json.loads(raw) if raw else {}))
    finally:
        conn.close()
    return results


def assert_serving(http: httpx.Client, model: str | None = None) -> None:
    """A normal completion on the same keep-alive connection still succeeds."""
    body = {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}
    if model:
        body["model"] = model
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 2


# --------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer) -> Iterator[RemoteServer]:
    yield from shared_server(stories_server)  # the session's default-flags server


@pytest.fixture(scope="module")
def guarded() -> Iterator[RemoteServer]:
    yield from pool_server(GUARDED)


@pytest.fixture(scope="module")
def http(server: RemoteServer) -> Iterator[httpx.Client]:
    # Shared keep-alive client (httpx quietly replaces a connection the server closed; the strict
    # check of that is same_connection()).
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> Iterator[openai.OpenAI]:
    # No retries: a retried 429/5xx or dropped connection must fail the test, not hide.
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


# ------------------------------------------------------- errors keep the keep-alive connection


def test_errors_keep_the_connection_open(server) -> None:
    # One of each way an error is raised: pydantic validation, SamplingParams/engine ValueError,
    # APIError from a handler, TypeError in /generate, unparsable JSON, unknown route.
    good = ("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 2})
    bad = [
        ("POST", "/v1/completions", {"prompt": "Once", "temperature": -1}),
        ("POST", "/v1/completions", {"prompt": "Once", "logprobs": 100}),
        ("POST", "/v1/completions", {"prompt": "Once", "best_of": 3}),
        (
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {str(OOV): 1}},
        ),
        ("POST", "/v1/completions", {"prompt": "Once", "model": "no-such-model"}),
        ("POST", "/v1/completions", {"prompt": LONG_TEXT}),
        ("POST", "/generate", {"prompt": "Once", "bogus_field": 1}),
        ("POST", "/generate", {"prompt": "Once", "temperature": -1}),
        ("POST", "/generate", {"prompt": "Once", "length_penalty": "x"}),
        ("POST", "/tokenize", {}),
        ("POST", "/v1/completions", b"{oops"),
        ("POST", "/generate", b"[1]"),
        ("GET", "/v1/nope", None),
    ]
    sequence = [r for b in bad for r in (b, good)]
    for (status, body), req in zip(same_connection(server, sequence), sequence):
        if req is good:
            assert status == 200 and body["usage"]["completion_tokens"] == 2, body
        else:
            assert 400 <= status < 500 and set(body["error"]) >= {"message", "type", "param", "code"}, (req, body)


# ------------------------------------------------------------------------ invalid parameters: 400

BAD_COMPLETION_PARAMS = [
    ({"temperature": -1}, ["temperature"]),
    ({"top_p": 2}, ["top_p"]),
    ({"n": 0}, []),
    ({"max_tokens": 0}, ["max_tokens"]),
    ({"logprobs": 100}, ["logprobs", "20"]),
    ({"logit_bias": {str(OOV): 1}}, ["logit_bias", "vocabulary"]),
    ({"extra_body": {"stop_token_ids": [OOV]}}, ["stop_token_ids", "vocabulary"]),
    ({"best_of": 3}, ["best_of"]),
    ({"presence_penalty": 3}, ["presence_penalty"]),
    ({"extra_body": {"top_k": -5}}, ["top_k"]),
    ({"extra_body": {"min_tokens": 9}, "max_tokens": 3}, ["min_tokens"]),
    ({"stop": [""]}, ["stop"]),
    ({"seed": 2**70}, ["seed"]),
    ({"prompt": ""}, ["empty"]),
    ({"prompt": []}, ["empty"]),
    ({"prompt": ["Once", ""]}, ["empty"]),
    ({"prompt": [[]]}, ["empty"]),
    ({"prompt": [OOV]}, ["vocabulary"]),
    ({"prompt": [[1, 2], [-1]]}, ["vocabulary"]),
]


@pytest.mark.parametrize("extra,words", BAD_COMPLETION_PARAMS, ids=[str(c[0]) for c in BAD_COMPLETION_PARAMS])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_completion_invalid_params_400(client, http, extra, words, stream) -> None:
    # A streaming request that fails validation must get a 400 status, not a 200 SSE stream with an error.
    kwargs = {"model": STORIES, "prompt": "Once", "max_tokens": 5, "stream": stream, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**kwargs)
    assert_sdk_error(e.value, 400, *words)
    assert_serving(http)


BAD_CHAT_PARAMS = [
    ({"messages": []}, ["messages"]),
    ({"temperature": -1}, ["temperature"]),
    ({"n": 0}, []),
    ({"max_completion_tokens": 0}, ["max_completion_tokens"]),
    ({"logit_bias": {str(OOV): 1}}, ["logit_bias", "vocabulary"]),
    ({"logprobs": True, "top_logprobs": 100}, ["logprobs", "20"]),
    ({"top_logprobs": 3}, ["logprobs"]),
    ({"extra_body": {"best_of": 2}, "n": 1}, ["best_of"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, ["image_url"]),
    ({"messages": [{"content": "no role"}]}, ["role"]),
]


@pytest.mark.parametrize("extra,words", BAD_CHAT_PARAMS, ids=[str(c[0]) for c in BAD_CHAT_PARAMS])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_chat_invalid_params_400(client, http, extra, words, stream) -> None:
    kwargs = {
        "model": STORIES,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": stream,
        **extra,
    }
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**kwargs)
    assert_sdk_error(e.value, 400, *words)
    assert_serving(http)


# -------------------------------------------------------------------------- context length: 400


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", {"prompt": LONG_TEXT}, "prompt"),
        ("/v1/completions", {"prompt": [5] * 513, "max_tokens": None}, "prompt"),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 600}, "max_tokens"),
        ("/v1/completions", {"prompt": [5] * 500, "max_tokens": 13}, "max_tokens"),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 600, "stream": True}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_TEXT}]}, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 600},
            "max_tokens",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_TEXT}], "stream": True}, "messages"),
        ("/generate", {"prompt": LONG_TEXT}, "prompt"),
        ("/generate", {"prompt": "Once", "max_tokens": 600}, "max_tokens"),
    ],
)
def test_context_length_400(http, path, body, param) -> None:
    err = assert_error(http.post(path, json=body), 400, "maximum context length", "512")
    assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    assert_serving(http)


def test_prompt_that_exactly_fits_is_served(http) -> None:
    # The boundary: 500 prompt tokens + 12 = 512 is allowed (the check must not be off by one).
    resp = http.post("/v1/completions", json={"prompt": [5] * 500, "max_tokens": 12, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["total_tokens"] == 512


# ---------------------------------------------------------------------------- unknown model: 404


def test_unknown_model_404(client, http) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="Once", max_tokens=2)
    err = assert_sdk_error(e.value, 404, "no-such-model")
    assert err["code"] == "model_not_found" and err["param"] == "model"
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=stream
            )
        assert_sdk_error(e.value, 404, "no-such-model")
    assert_error(http.post("/tokenize", json={"model": "no-such-model", "prompt": "x"}), 404)
    # The served name works with and without `model`.
    assert_serving(http, STORIES)
    assert_serving(http)


def test_unknown_route_and_method_have_error_bodies(http) -> None:
    assert_error(http.post("/v1/nope", json={}), 404)
    assert_error(http.get("/v1/completions"), 405)
    assert_serving(http)


# -------------------------------------------------------------------- malformed bodies: 4xx, not 500

MALFORMED = [
    (b"{not json", "application/json"),
    (b'{"prompt": "Once"', "application/json"),  # truncated
    (b"[1, 2]", "application/json"),
    (b'"a string"', "application/json"),
    (b"42", "application/json"),
    (b"null", "application/json"),
    (b"", "application/json"),
    (b"\xff\xfe\x00", "application/json"),
    (b"prompt=Once", "application/x-www-form-urlencoded"),
    (b'{"prompt": "Once", "messages": [{"role": "user", "content": "hi"}]}', "text/plain"),
    (b'{"prompt": 5, "messages": "hi"}', "application/json"),  # wrong field types
    (b'{"prompt": {"a": 1}, "messages": [1, 2]}', "application/json"),
    (b'{"prompt": null, "messages": null}', "application/json"),
    (b'{"prompt": "Once", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}', "application/json"),
    (b'{"prompt": "Once", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "application/json"),
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate", "/tokenize"])
@pytest.mark.parametrize("content,ctype", MALFORMED, ids=[c[0][:24].decode("latin-1") + "|" + c[1] for c in MALFORMED])
def test_malformed_body_4xx(http, path, content, ctype) -> None:
    resp = http.post(path, content=content, headers={"content-type": ctype})
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert_error(resp, resp.status_code)
    assert_serving(http)


# -------------------------------------------------------------- /generate's SamplingParams: 400


@pytest.mark.parametrize(
    "body,words",
    [
        ({"prompt": "Once", "bogus_field": 1}, ["bogus_field"]),
        ({"prompt": "Once", "temperature": -1}, ["temperature"]),
        ({"prompt": "Once", "temperature": -1, "stream": True}, ["temperature"]),
        ({"prompt": "Once", "top_p": 0}, ["top_p"]),
        ({"prompt": "Once", "max_tokens": 0}, ["max_tokens"]),
        ({"prompt": "Once", "n": "two"}, ["n"]),
        ({"prompt": "Once", "logprobs": 100}, ["logprobs"]),
        ({"prompt": "Once", "stop_token_ids": [OOV]}, ["stop_token_ids"]),
        ({"prompt": "Once", "logit_bias": [1]}, ["logit_bias"]),
        ({"prompt": "Once", "use_beam_search": True, "n": 0}, ["n"]),
        ({"prompt": "Once", "use_beam_search": True, "n": 0, "stream": True}, ["n"]),
        ({"prompt": ""}, ["prompt"]),
        ({"prompt": ["Once"]}, ["prompt"]),
    ],
)
def test_generate_bad_sampling_params_400(http, body, words) -> None:
    assert_error(http.post("/generate", json=body), 400, *words)
    resp = http.post("/generate", json={"prompt": "Once", "max_tokens": 2})
    assert resp.status_code == 200 and resp.json()["text"][0].startswith("Once"), resp.text


# -------------------------------------------------------------------------------- auth: 401


def test_api_key(guarded) -> None:
    url = guarded.url + "/v1"
    for key in ("wrong", KEY + "x"):
        with openai.OpenAI(base_url=url, api_key=key, max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError) as e:
                bad.completions.create(model=TINY, prompt="Once", max_tokens=2)
            assert assert_sdk_error(e.value, 401)["code"] == "invalid_api_key"
            with pytest.raises(openai.AuthenticationError):
                bad.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], stream=True)
    with httpx.Client(base_url=guarded.url, timeout=60) as http:
        body = {"model": TINY, "prompt": "Once", "max_tokens": 2}
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": KEY},
            {"Authorization": f"Basic {KEY}"},
            {"Authorization": f"Bearer {KEY}{KEY}"},
        ):
            assert_error(http.post("/v1/completions", json=body, headers=headers), 401)
            assert_error(http.get("/v1/models", headers=headers), 401)
        # Auth comes before body parsing: a malformed body without a key is still a 401.
        assert_error(http.post("/v1/chat/completions", content=b"{oops"), 401)
        # Health checks and scrapers need no key.
        assert http.get("/health").status_code == 200
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "tram" in metrics.text
        http.headers["Authorization"] = f"Bearer {KEY}"
        assert http.get("/v1/models").json()["data"][0]["id"] == TINY
        assert_serving(http, TINY)
        # With the right key, the other errors are the usual ones: the model path is not a served name.
        assert_error(http.post("/v1/completions", json={**body, "model": STORIES}), 404)
    with openai.OpenAI(base_url=url, api_key=KEY, max_retries=0) as good:
        out = good.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert out.model == TINY and out.usage.completion_tokens == 2


# ------------------------------------------------------------------------- queue overload: 429


def test_queue_full_429(guarded) -> None:
    """max-num-seqs 1, max-queued 1: one long request runs and one waits; the next gets a 429."""
    headers = {"Authorization": f"Bearer {KEY}"}
    long_cmpl = {"model": TINY, "prompt": "Once", "max_tokens": 480, "ignore_eos": True, "stream": True}
    long_chat = {
        "model": TINY,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 480,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as sdk,
        httpx.Client(base_url=guarded.url, headers=headers, timeout=60) as http,
    ):
        with (
            http.stream("POST", "/v1/completions", json=long_cmpl) as running,
            http.stream("POST", "/v1/chat/completions", json=long_chat) as waiting,
        ):
            assert running.status_code == 200 and waiting.status_code == 200
            busy = lambda s: s["num_running_reqs"] == 1 and s["num_waiting_reqs"] == 1  # noqa: E731
            state = wait_state(guarded, busy, timeout=15)
            assert busy(state), f"expected one running and one waiting request: {state}"
            with pytest.raises(openai.RateLimitError) as e:
                sdk.completions.create(model=TINY, prompt="Once", max_tokens=2)
            assert assert_sdk_error(e.value, 429, "busy")["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                sdk.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], stream=True)
            # Raw: a streaming request that is refused gets the 429 status, not a 200 stream.
            with http.stream("POST", "/v1/completions", json={**long_cmpl, "max_tokens": 2}) as refused:
                refused.read()
                assert_error(refused, 429)
            assert_error(http.post("/generate", json={"prompt": "Once", "max_tokens": 2}), 429)
            # ...and the 429 leaves the client's connection usable.
            models = ("GET", "/v1/models", None)
            results = same_connection(guarded, [("POST", "/v1/completions", {"prompt": "Once"}), models], headers)
            assert [status for status, _ in results] == [429, 200], results
            # Validation still comes first: a bad request is a 400 even when the queue is full.
            assert_error(http.post("/v1/completions", json={**long_cmpl, "max_tokens": 600}), 400)
        # Leaving the blocks dropped both streams, which aborts their requests.
        state = wait_state(guarded, is_idle, timeout=15)
        assert is_idle(state), f"dropped streams were not aborted: {state}"
        # The queue is empty now, so the server must admit requests again (not 429 forever).
        resp = http.post("/v1/completions", json={"model": TINY, "prompt": "Once", "max_tokens": 2})
        assert resp.status_code == 200, f"still refused after the queue drained ({state}): {resp.text}"
        out = sdk.completions.create(model=TINY, prompt="Once", max_tokens=2)
        assert out.usage.completion_tokens == 2
