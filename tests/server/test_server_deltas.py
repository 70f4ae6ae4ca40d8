"""Streaming with DELTA outputs on a server whose 16-token step budget splits every prompt's prefill
(and so its prompt logprobs) over several steps: what a client assembles from the chunks equals
the non-streamed response, prompt logprobs included, for n > 1 and several prompts."""

from __future__ import annotations

import json
from collections import defaultdict

import httpx
import pytest
from conftest import STORIES
from server_pool import ServerSpec, pool_server
from server_utils import RemoteServer

LONG_PROMPT = "Once upon a time there was a little girl named Lily. She loved to play in the park with her dog."
SERVER = ServerSpec(STORIES, ("--max-num-batched-tokens", "16", "--max-num-seqs", "8"), (("OMP_NUM_THREADS", "1"),))
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)


@pytest.fixture(scope="module")
def server():
    yield from pool_server(SERVER)  # ends idle, then exits cleanly (server_utils.stop_clean)


def sse_chunks(server: RemoteServer, path: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def test_echo_with_logprobs_streams_every_prompt_position(server):
    body = {
        "model": STORIES,
        "prompt": [LONG_PROMPT, "Tom and his dog"],
        "max_tokens": 6,
        "n": 2,
        "temperature": 1.0,
        "seed": 5,
        "echo": True,
        "logprobs": 2,
    }
    full = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    text, lps, offsets, tokens = defaultdict(str), defaultdict(list), defaultdict(list), defaultdict(list)
    usage = None
    for chunk in sse_chunks(server, "/v1/completions", {**body, "stream_options": {"include_usage": True}}):
        if not chunk["choices"]:
            usage = chunk["usage"]
        for c in chunk["choices"]:
            if c["logprobs"] is not None:
                # Each chunk's offsets continue from the text the client has assembled so far.
                assert c["logprobs"]["text_offset"][:1] in ([], [len(text[c["index"]])])
                lps[c["index"]] += c["logprobs"]["token_logprobs"]
                offsets[c["index"]] += c["logprobs"]["text_offset"]
                tokens[c["index"]] += c["logprobs"]["tokens"]
            text[c["index"]] += c["text"]
    assert usage == full["usage"]
    assert sorted(text) == [0, 1, 2, 3]
    for choice in full["choices"]:
        i = choice["index"]
        assert text[i] == choice["text"] and text[i].startswith(LONG_PROMPT if i < 2 else "Tom and his dog")
        # Batches (and so float rounding) differ between the two runs.
        assert lps[i] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-4)
        assert tokens[i] == choice["logprobs"]["tokens"]
        # Offsets within one chunk add up token texts, as vLLM's (and so differ from the
        # non-streamed ones once a chunk boundary resets them to the assembled text's length).
        assert offsets[i] == sorted(offsets[i])
        assert lps[i][0] is None and all(isinstance(x, float) for x in lps[i][1:])
    prompt_len = httpx.post(server.url + "/tokenize", json={"prompt": LONG_PROMPT}).json()["count"]
    assert prompt_len > 16 and len(lps[0]) == prompt_len + 6  # every prompt position, then the tokens


def test_chat_stream_with_stop_strings_and_n(server):
    body = {
        "model": STORIES,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 40,
        "n": 3,
        "temperature": 1.0,
        "seed": 11,
        "stop": [" the", "."],
        "logprobs": True,
        "top_logprobs": 1,
    }
    full = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    text, roles, n_lps, finish = defaultdict(str), defaultdict(list), defaultdict(int), {}
    chunks = sse_chunks(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    for chunk in chunks[:-1]:
        for c in chunk["choices"]:
            assert c["index"] not in finish, "a chunk after the choice finished"
            roles[c["index"]].append(c["delta"].get("role"))
            text[c["index"]] += c["delta"]["content"]
            n_lps[c["index"]] += len((c["logprobs"] or {"content": []})["content"])
            if c["finish_reason"] is not None:
                finish[c["index"]] = (c["finish_reason"], c["stop_reason"])
    assert chunks[-1]["usage"] == full["usage"]
    for choice in full["choices"]:
        i = choice["index"]
        assert text[i] == choice["message"]["content"]
        assert finish[i] == (choice["finish_reason"], choice["stop_reason"])
        assert n_lps[i] == len(choice["logprobs"]["content"])
        assert roles[i][0] == "assistant" and not any(roles[i][1:])
