"""A real `tram serve` in a subprocess on a free port, for the server tests.

The launcher lives in `tram.bench.server_process` (the benchmarks use it too); the tests' server
has the dev routes on, for `kv_state()`.
"""
from __future__ import annotations

from pathlib import Path

from tram.bench.server_process import REPO, TramServer, child_pids, free_port, pid_alive

__all__ = ["REPO", "RemoteServer", "child_pids", "free_port", "pid_alive"]


class RemoteServer(TramServer):
    """Starts `python -m tram serve MODEL ARGS` and waits for /health; `stop()` checks a clean exit."""

    def __init__(self, model: str | Path, args: list[str] | None = None, timeout: float = 90.0) -> None:
        super().__init__(str(model), args, timeout, dev_mode=True)
