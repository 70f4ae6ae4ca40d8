"""`tram serve --tensor-parallel-size 2`: it answers the OpenAI SDK as one rank does; a killed worker
rank fails the requests in flight and turns /health 503 within seconds; SIGTERM leaves no process."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
from conftest import STORIES
from server_pool import POOL, ServerSpec
from server_utils import RemoteServer, child_pids, openai_client, pid_alive

from tram import LLM, SamplingParams

SERVING = ServerSpec(STORIES, ("--tensor-parallel-size", "2", "--max-num-seqs", "16"))
DOOMED = ServerSpec(STORIES, ("--tensor-parallel-size", "2"))  # a rank of it is killed
SERVERS = (SERVING, DOOMED)  # each started ahead of the test that takes it (server_pool.py)


def _worker_pids(server: RemoteServer) -> list[int]:
    pids = []
    for engine in server.engine_pids:
        for pid in child_pids(engine):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"tram.executor.worker_proc" in f.read():
                    pids.append(pid)
    return pids


def _family(server: RemoteServer) -> list[int]:
    return [*server.engine_pids, *_worker_pids(server)]


def test_serves_the_openai_sdk_and_exits_clean_on_sigterm() -> None:
    expected = (
        LLM(str(STORIES), max_num_seqs=4)
        .generate("Once upon a time", SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    s = POOL.take(SERVING)
    try:
        workers = _worker_pids(s)
        assert len(workers) == 2
        family = _family(s)
        client = openai_client(s)
        done = client.completions.create(model=str(STORIES), prompt="Once upon a time", max_tokens=24, temperature=0)
        assert done.choices[0].text == expected
        chat = client.chat.completions.create(
            model=str(STORIES), max_tokens=8, messages=[{"role": "user", "content": "Hello"}]
        )
        assert chat.choices[0].finish_reason in ("length", "stop")
        assert s.kv_state()["blocks"]["in_use"] == 0
    finally:
        code = s.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM)
    assert not any(pid_alive(p) for p in family), [p for p in family if pid_alive(p)]


def test_a_killed_rank_fails_requests_and_health() -> None:
    s = POOL.take(DOOMED)
    family = _family(s)
    try:
        with httpx.Client(base_url=s.url, timeout=30) as client:
            body = {"prompt": "Hello", "max_tokens": 500, "ignore_eos": True, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as resp:
                lines = resp.iter_lines()
                next(lines)
                os.kill(_worker_pids(s)[1], signal.SIGKILL)
                start = time.time()
                rest = [line for line in lines if line]
            assert time.time() - start < 10
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2][6:])["error"]
            assert error["code"] == 503 and "rank 1" in error["message"]
            assert client.get("/health").status_code == 503
    finally:
        s.stop()
    deadline = time.time() + 10
    while any(pid_alive(p) for p in family) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in family)
