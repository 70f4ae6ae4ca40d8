"""Servers in subprocesses, for benchmarks and tests: started, awaited until GET /health answers 200,
and stopped with a check that nothing they started outlives them.

`TramServer` runs `python -m tram serve` on a free port (the test suite's server fixture, the host
overhead profiler and the llama.cpp comparison all use it); `ServerProcess` runs any other
OpenAI-compatible server that has a /health endpoint (llama.cpp's `llama-server`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import tram

# The folder that holds this `tram` package: `python -m tram` run there imports this same tram (a
# checkout's, not another one installed in the environment).
REPO = Path(tram.__file__).resolve().parent.parent
# No proxy for requests to 127.0.0.1, whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; it only waits to be reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def get_json(url: str, timeout: float = 10.0) -> Any:
    with _OPENER.open(url, timeout=timeout) as resp:
        return json.load(resp)


def is_healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with _OPENER.open(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:  # refused, timed out, or an HTTP error status such as 503
        return False


class ServerProcess:
    """`argv` in a subprocess, its output in a log file, ready once GET {url}/health answers 200.

    `stop()` sends a signal and waits; strict (the default) raises if the server hangs or leaves a
    child process behind (what the tests check), otherwise it kills what is left and carries on.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        *,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}-{port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, **(env or {})}, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            if is_healthy(self.url):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not become healthy in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def url_for(self, path: str) -> str:
        return self.url + path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0, strict: bool = True) -> int:
        """Signal the server; return its exit code. Strict: raises if it or a child outlives `timeout`."""
        children = child_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            if strict:
                raise RuntimeError(f"{self.name} hung on signal {sig}:\n{self.log()}") from None
        finally:
            self._log.close()
        self._reap(children, timeout, strict)
        return code

    def _reap(self, children: list[int], timeout: float, strict: bool) -> None:
        deadline = time.time() + timeout
        while any(pid_alive(p) for p in children) and time.time() < deadline:
            time.sleep(0.1)
        orphans = [p for p in children if pid_alive(p)]
        for p in orphans:
            os.kill(p, signal.SIGKILL)
        if orphans and strict:
            raise RuntimeError(f"process(es) {orphans} outlived {self.name}")


class TramServer(ServerProcess):
    """`python -m tram serve MODEL ARGS` on a free port (or `port`).

    dev_mode turns on the debug routes the tests read (/debug/kv_integrity, `kv_state()`); `env` adds
    to (or overrides) this process's environment for the server.
    """

    def __init__(
        self,
        model: str,
        args: list[str] | None = None,
        timeout: float = 90.0,
        *,
        port: int | None = None,
        dev_mode: bool = False,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        port = port or free_port()
        env = {"PYTHONUNBUFFERED": "1", **({"TRAM_SERVER_DEV_MODE": "1"} if dev_mode else {}), **(env or {})}
        argv = [sys.executable, "-m", "tram", "serve", model, "--port", str(port), *(args or [])]
        super().__init__("tram-serve", argv, port, log_path=log_path, env=env, timeout=timeout)
        # The engine-core process (and multiprocessing's resource tracker), started by now.
        self.engine_pids = child_pids(self.proc.pid)

    def engine_core_pid(self) -> int:
        """The engine-core child (multiprocessing also starts a resource tracker)."""
        for pid in self.engine_pids:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"resource_tracker" not in f.read():
                    return pid
        raise RuntimeError(f"no engine-core process among the server's children {self.engine_pids}")

    def kv_state(self) -> dict[str, Any]:
        return get_json(self.url + "/debug/kv_integrity")
