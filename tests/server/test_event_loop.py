"""No single request may stall the server: tokenizing and chat templates run off the event loop,
bodies over --max-request-body-bytes are a 413 before they are read, a text whose length alone
proves it cannot fit is refused before it is tokenized, and thousands of prompts in one request
are submitted without holding the loop. /health answers within 100 ms meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from conftest import STORIES
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer, module_client

LIMIT = 4_000_000
SERVER = ServerSpec(STORIES, ("--max-request-body-bytes", str(LIMIT)))
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)


@pytest.fixture(scope="module")
def server():
    # No server starts beside these tests: /health's latency bounds leave no core to spare.
    yield from pool_server(SERVER, prefetch=False)


@pytest.fixture(scope="module")
def client(server: RemoteServer):
    yield from module_client(server)


def _health_latencies_during(
    server: RemoteServer,
    work: Callable[[], httpx.Response],
) -> tuple[httpx.Response, list[float]]:
    """Run `work` while another client polls /health; return its response and every poll's latency."""
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            c.get("/health")  # connect before measuring
            while not done.is_set():
                start = time.perf_counter()
                assert c.get("/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.1)
    try:
        resp = work()
    finally:
        time.sleep(0.1)
        done.set()
        poller.join()
    return resp, latencies


def _assert_responsive(latencies: list[float]) -> None:
    """Every poll within 100 ms but one, which may reach 300 ms: on 2 cores shared by the server, its
    engine, this test and the heavy client, the OS scheduler alone sometimes delays one poll past
    100 ms (seen at 106-118 ms). A stall of the event loop, as before the fix (0.6-2 s), delays every
    poll that falls in it and fails both bounds."""
    assert len(latencies) >= 3, latencies  # polls ran before, during and after the request
    worst = sorted(latencies)[-2:]
    assert worst[0] < 0.1 and worst[-1] < 0.3, (
        f"/health took {worst[-1] * 1000:.0f} and {worst[0] * 1000:.0f} ms (of {len(latencies)} polls)"
    )


def test_health_answers_while_a_long_prompt_is_tokenized(server, client) -> None:
    # truncate_prompt_tokens asks for the whole text to be tokenized (its end is kept), so the
    # length check cannot refuse it: about a second of tokenizing on this machine.
    body = {"prompt": "Once upon a time, there was a girl. " * 50_000, "max_tokens": 1, "truncate_prompt_tokens": 50}
    resp, latencies = _health_latencies_during(server, lambda: client.post("/v1/completions", json=body))
    assert resp.status_code == 200, resp.text
    _assert_responsive(latencies)


def test_health_answers_during_ten_thousand_prompts(server, client) -> None:
    body = {"prompt": [[5, 6, 7, 8 + i % 100] for i in range(10_000)], "max_tokens": 1}
    resp, latencies = _health_latencies_during(server, lambda: client.post("/v1/completions", json=body))
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 10_000
    _assert_responsive(latencies)


def test_health_answers_while_a_chat_is_rendered(server, client) -> None:
    messages = [{"role": "user", "content": "hi there " * 20}] * 2000
    body = {"messages": messages, "max_tokens": 1, "truncate_prompt_tokens": 50}
    resp, latencies = _health_latencies_during(server, lambda: client.post("/v1/chat/completions", json=body))
    assert resp.status_code in (200, 400), resp.text  # stories260K's template may refuse roles
    _assert_responsive(latencies)


def test_a_body_over_the_limit_is_a_413(client) -> None:
    big = {"prompt": "x" * (LIMIT + 10)}
    start = time.perf_counter()
    resp = client.post("/v1/completions", json=big)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == 413, resp.text
    assert time.perf_counter() - start < 5

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(LIMIT // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    resp = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413, resp.text


def test_a_text_too_long_by_its_length_is_refused_before_tokenizing(client) -> None:
    text = "a" * (LIMIT // 2)  # about 2 MB: far more characters than 512 tokens can hold
    start = time.perf_counter()
    resp = client.post("/v1/completions", json={"prompt": text, "max_tokens": 1})
    elapsed = time.perf_counter() - start
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded", resp.text
    assert elapsed < 2, elapsed
    chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    resp = client.post("/v1/chat/completions", json=chat)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded", resp.text
