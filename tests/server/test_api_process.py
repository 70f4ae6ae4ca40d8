"""The API server process never loads torch: it tokenizes, validates and streams, and reaches the
model only through the message structs of tram/engine/messages.py. The engine core process does."""

from __future__ import annotations

import os

import httpx
import pytest
from server_utils import RemoteServer, shared_server

from tram.executor.cpu_threads import choose_cpu_threads, usable_cores


def _loads_torch(pid: int) -> bool:
    """Whether torch's native library is mapped into the process (an `import torch` maps it)."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return "libtorch" in maps or "/torch/_C" in maps


def _environ(pid: int) -> dict[str, str]:
    """The environment the process started with (what libgomp read when torch loaded)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.decode().partition("=") for item in f.read().split(b"\0") if item]
    return {k: v for k, _, v in pairs}


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer):
    yield from shared_server(stories_server)  # the session's default-flags server


def test_api_process_runs_without_torch(server: RemoteServer) -> None:
    # Whatever the shared server served before, its API process has not imported torch.
    srv = server
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    first = httpx.post(srv.url_for("/v1/completions"), json=body, timeout=30).json()
    assert len(first["choices"][0]["text"]) > 0
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", srv.url_for("/v1/chat/completions"), json=chat, timeout=30) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    assert not _loads_torch(srv.proc.pid), "the API server process imported torch"
    engines = [pid for pid in srv.engine_pids if _loads_torch(pid)]
    assert engines, "the engine core should run torch"
    # The OpenMP wait policy reached the engine core's environment at spawn (executor/cpu_threads.py).
    engine_env = _environ(engines[0])
    for name, value in choose_cpu_threads(os.environ, usable_cores()).env.items():
        assert engine_env.get(name) == value, (name, engine_env.get(name))
