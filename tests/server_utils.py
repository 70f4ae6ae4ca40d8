"""A real `tram serve` in a subprocess on a free port, for the server tests.

The launcher lives in `tram.bench.server_process` (the benchmarks use it too); the tests' server
has the dev routes on, for `kv_state()`.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from tram.bench.server_process import REPO, TramServer, child_pids, free_port, pid_alive

__all__ = ["REPO", "RemoteServer", "child_pids", "free_port", "is_idle", "pid_alive", "module_client", "module_server", "settled_kv", "stop_clean", "wait_state"]


class RemoteServer(TramServer):
    """Starts `python -m tram serve MODEL ARGS` and waits for /health; `stop()` checks a clean exit."""

    def __init__(self, model: str | Path, args: list[str] | None = None, timeout: float = 90.0) -> None:
        super().__init__(str(model), args, timeout, dev_mode=True)


def is_idle(state: dict) -> bool:
    """No KV block in use and no request running, waiting, or unfinished in the front end."""
    return (state["blocks"]["in_use"] == 0 and state["num_running_reqs"] == 0
            and state["num_waiting_reqs"] == 0 and state["num_unfinished_in_frontend"] == 0)


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


def stop_clean(server: RemoteServer, timeout: float = 20.0) -> None:
    """A module fixture's teardown: the block pool's accounting is clean, then the server exits cleanly."""
    try:
        state = settled_kv(server, timeout)
        assert is_idle(state), f"requests or KV blocks left behind: {state}"
    finally:
        code = server.stop()
    assert code in (0, -signal.SIGTERM), code


def module_server(model: str | Path, args: list[str] | None = None) -> Iterator[RemoteServer]:
    """The body of a module-scoped server fixture (`yield from module_server(...)`): a server that
    must end the module with clean KV accounting and a clean exit."""
    server = RemoteServer(model, args)
    yield server
    stop_clean(server)


def module_client(server: RemoteServer, timeout: float = 120) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=timeout) as client:
        yield client
