"""The server under many users, dropped clients, a dead engine and signals."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import STORIES
from server_pool import POOL, ServerSpec, pool_server
from server_utils import REPO, RemoteServer, free_port, pid_alive


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def _wait_idle(server: RemoteServer, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        state = server.kv_state()
        idle = state["blocks"]["in_use"] == 0 and state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0
        if idle or time.time() > deadline:
            return state
        time.sleep(0.05)


SERVER = ServerSpec(STORIES, ("--max-num-seqs", "32"))
DOOMED = ServerSpec(STORIES)  # a server of its own for each test that stops or kills it
SERVERS = (SERVER, DOOMED, DOOMED)  # each started ahead of the test that takes it (server_pool.py)


@pytest.fixture(scope="module")
def server():
    yield from pool_server(SERVER)  # ends idle, then exits cleanly (server_utils.stop_clean)


async def _stream(client: httpx.AsyncClient, i: int, drop_after: int | None) -> tuple[int, str | None]:
    """Stream one completion; return (chunks read, finish_reason), or drop it after some chunks."""
    body = {
        "prompt": f"Once upon a time {i}",
        "max_tokens": 200,
        "temperature": 0.8,
        "seed": i,
        "ignore_eos": True,
        "stream": True,
    }
    chunks, finish = 0, None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            chunks += 1
            finish = choice["finish_reason"] or finish
            if drop_after is not None and chunks >= drop_after:
                return chunks, None  # leaving the block closes the connection mid-stream
    return chunks, finish


def test_64_streams_with_a_quarter_dropped_midway(server: RemoteServer) -> None:
    async def run() -> list[tuple[int, str | None]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*[_stream(client, i, 3 if i % 4 == 0 else None) for i in range(64)])

    results = asyncio.run(run())
    kept = [r for i, r in enumerate(results) if i % 4 != 0]
    assert all(finish == "length" for _, finish in kept), kept
    state = _wait_idle(server)
    assert state["blocks"]["in_use"] == 0 and state["num_running_reqs"] == 0, state
    metrics = httpx.get(server.url + "/metrics").text
    assert _metric(metrics, "tram:num_requests_running") == 0
    assert _metric(metrics, "tram:kv_cache_usage_perc") == 0
    assert _metric(metrics, f'tram:request_success_total{{finished_reason="length",model_name="{STORIES}"}}') >= 48


def test_metrics_reach_zero_when_every_client_drops(server: RemoteServer) -> None:
    """Aborts leave the engine idle; the gauges must still come down (no step follows to report)."""
    label = f'finished_reason="abort",model_name="{STORIES}"'
    aborted_before = _metric(httpx.get(server.url + "/metrics").text, f"tram:request_success_total{{{label}}}")

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            await asyncio.gather(*[_stream(client, i, 2) for i in range(8)])

    asyncio.run(run())
    deadline = time.time() + 5
    while True:
        metrics = httpx.get(server.url + "/metrics").text
        idle = _metric(metrics, "tram:num_requests_running") == 0 and _metric(metrics, "tram:kv_cache_usage_perc") == 0
        if idle or time.time() > deadline:
            break
        time.sleep(0.05)
    assert idle, metrics
    assert _metric(metrics, f"tram:request_success_total{{{label}}}") == aborted_before + 8


def test_serving_benchmark_client_counts_every_token(server: RemoteServer) -> None:
    from tram.bench.datasets import random_requests
    from tram.bench.serve import benchmark, fetch_model_id

    reqs = random_requests(8, (4, 12), (16, 16), vocab_size=512, seed=0, exclude_ids={0, 1, 2})
    model = asyncio.run(fetch_model_id(server.url))
    result = asyncio.run(benchmark(server.url, model, reqs, max_concurrency=4, warmup=0))
    assert result["total_output_tokens"] == 8 * 16 and result["completed"] == 8
    assert result["max_concurrency_observed"] <= 4
    assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"]


def test_dropped_non_streaming_request_is_aborted(server: RemoteServer) -> None:
    body = {"prompt": ["Hi"] * 8, "n": 4, "max_tokens": 505, "ignore_eos": True, "temperature": 1.0}
    with pytest.raises(httpx.ReadTimeout):  # 32 sequences of 505 tokens take seconds, whatever the CPU
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
    # The server notices the closed connection and aborts long before 505 tokens are done.
    state = _wait_idle(server, timeout=5.0)
    assert state["num_running_reqs"] == 0 and state["blocks"]["in_use"] == 0, state


def test_sigint_with_streams_in_flight_shuts_down_cleanly() -> None:
    s = POOL.take(DOOMED)
    with httpx.Client(base_url=s.url, timeout=30) as client:
        body = {"prompt": "Hello", "max_tokens": 500, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as resp:
            next(resp.iter_lines())
            start = time.time()
            s.stop(signal.SIGINT)  # raises if the server hangs or leaves its engine behind
    assert time.time() - start < 15


def test_engine_death_fails_requests_and_health() -> None:
    s = POOL.take(DOOMED)
    try:
        engine_pid = next(p for p in s.engine_pids if _is_engine(p))
        with httpx.Client(base_url=s.url, timeout=30) as client:
            body = {"prompt": "Hello", "max_tokens": 500, "ignore_eos": True, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as resp:
                lines = resp.iter_lines()
                next(lines)
                os.kill(engine_pid, signal.SIGKILL)
                start = time.time()
                rest = [line for line in lines if line]
            assert time.time() - start < 5
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2][6:])["error"]
            assert error["code"] == 503 and "engine" in error["message"]
            assert client.get("/health").status_code == 503
            r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 503 and "error" in r.json()
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
            assert r.status_code == 503
    finally:
        s.stop()
    assert not pid_alive(engine_pid)


def _is_engine(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read()
    return b"spawn_main" in cmd and b"resource_tracker" not in cmd


def test_bad_flags_exit_with_a_message() -> None:
    out = subprocess.run(
        # A free port: the port is checked first, and 8000 may be someone else's server.
        [sys.executable, "-m", "tram", "serve", str(STORIES), "--max-model-len", "100000", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert "max_model_len 100000" in out.stderr and "max_position_embeddings = 512" in out.stderr
