"""A real `tram serve` in a subprocess on a free port, for the server tests.

The launcher lives in `tram.bench.server_process` (the benchmarks use it too); the tests' server
has the dev routes on, for `kv_state()`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from tram.bench.server_process import REPO, TramServer, child_pids, free_port, pid_alive

if TYPE_CHECKING:
    from server_pool import ServerSpec

__all__ = [
    "DEFAULT_SERVER_ENV",
    "REPO",
    "RemoteServer",
    "assert_idle",
    "child_pids",
    "free_port",
    "is_idle",
    "pid_alive",
    "module_client",
    "module_server",
    "openai_client",
    "openai_module_fixtures",
    "settled_kv",
    "shared_openai_fixtures",
    "shared_server",
    "stop_clean",
    "wait_state",
]

# The environment of the session's shared default-flags server (conftest.py's `stories_server`): one
# intra-op thread for the engine process, because on a small shared machine torch's OpenMP threads
# spin against other processes and a 3-sequence step can take a second instead of a millisecond.
DEFAULT_SERVER_ENV = {"OMP_NUM_THREADS": "1"}


class RemoteServer(TramServer):
    """Starts `python -m tram serve MODEL ARGS` and waits for /health; `stop()` checks a clean exit."""

    def __init__(
        self, model: str | Path, args: list[str] | None = None, timeout: float = 90.0, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(str(model), args, timeout, dev_mode=True, env=env)


def is_idle(state: dict) -> bool:
    """No KV block in use and no request running, waiting, or unfinished in the front end."""
    return (
        state["blocks"]["in_use"] == 0
        and state["num_running_reqs"] == 0
        and state["num_waiting_reqs"] == 0
        and state["num_unfinished_in_frontend"] == 0
    )


def wait_state(server: RemoteServer, done: Callable[[dict], bool], timeout: float) -> dict:
    """Poll the dev endpoint until `done(state)`; return the last state either way."""
    deadline = time.time() + timeout
    while True:
        state = server.kv_state()
        if done(state) or time.time() > deadline:
            return state
        time.sleep(0.05)


def settled_kv(server: RemoteServer, timeout: float = 5.0) -> dict:
    """The KV state once the server is idle (aborts free their blocks within a step), or the last seen."""
    return wait_state(server, is_idle, timeout)


def assert_idle(server: RemoteServer, timeout: float = 5.0) -> None:
    """After a workload: no request left and no KV block in use (none leaked)."""
    state = settled_kv(server, timeout)
    assert is_idle(state), f"requests or KV blocks left behind: {state}"


def stop_clean(server: RemoteServer, timeout: float = 20.0) -> None:
    """A module fixture's teardown: the block pool's accounting is clean, then the server exits cleanly."""
    try:
        assert_idle(server, timeout)
    finally:
        code = server.stop()
    assert code in (0, -signal.SIGTERM), code


def module_server(model: str | Path, args: list[str] | None = None) -> Iterator[RemoteServer]:
    """The body of a module-scoped server fixture (`yield from module_server(...)`): a server that
    must end the module with clean KV accounting and a clean exit."""
    server = RemoteServer(model, args)
    yield server
    stop_clean(server)


def shared_server(server: RemoteServer, timeout: float = 20.0) -> Iterator[RemoteServer]:
    """The body of a module-scoped fixture over the session's shared server (`yield from
    shared_server(stories_server)`): the module must leave it with no request and no KV block in use,
    as a server of its own would have to before its clean exit (which the session checks at its end).
    Modules that share it compare counters (metrics) as before/after deltas, never as totals."""
    yield server
    assert_idle(server, timeout)


def module_client(server: RemoteServer, timeout: float = 120) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=timeout) as client:
        yield client


def openai_client(server: RemoteServer, timeout: float = 60) -> openai.OpenAI:
    """The official SDK's client for this server's /v1, without retries (a failure shows at once)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=timeout)


def openai_module_fixtures(spec: ServerSpec) -> tuple:
    """The fixtures of a module that one server serves through the `openai` SDK: `server` (the
    server of `spec`, a server_pool.ServerSpec, as server_pool.pool_server gives it), `client`
    (openai_client), and `no_kv_in_use`, autouse, which checks after every test that no request is
    left and no KV block in use. Bind them to these names at the module's top level:
    `server, client, no_kv_in_use = openai_module_fixtures(SERVER)` (and list SERVER in SERVERS)."""

    @pytest.fixture(scope="module")
    def server() -> Iterator[RemoteServer]:
        from server_pool import pool_server  # server_pool builds on this module

        yield from pool_server(spec)

    return (server, *_client_fixtures())


def shared_openai_fixtures() -> tuple:
    """openai_module_fixtures' three fixtures over the session's shared default-flags server
    (conftest.py's `stories_server`, through shared_server) instead of a server of the module's own."""

    @pytest.fixture(scope="module")
    def server(stories_server: RemoteServer) -> Iterator[RemoteServer]:
        yield from shared_server(stories_server)

    return (server, *_client_fixtures())


def _client_fixtures() -> tuple:
    """`client` and the autouse `no_kv_in_use` over a module's `server` fixture."""

    @pytest.fixture(scope="module")
    def client(server: RemoteServer) -> openai.OpenAI:
        return openai_client(server)

    @pytest.fixture(autouse=True)
    def no_kv_in_use(server: RemoteServer) -> Iterator[None]:
        yield
        assert_idle(server)

    return client, no_kv_in_use
