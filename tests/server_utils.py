"""A real `tram serve` in a subprocess on a free port, for the server tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


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


class RemoteServer:
    """Starts `python -m tram serve MODEL ARGS` and waits for /health; `stop()` checks a clean exit."""

    def __init__(self, model: str, args: list[str] | None = None, timeout: float = 90.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "TRAM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"}
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tram-serve-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tram", "serve", model, "--port", str(self.port), *(args or [])],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        self._wait_healthy(timeout)
        self.engine_pids = child_pids(self.proc.pid)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tram serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tram serve did not become healthy in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def url_for(self, path: str) -> str:
        return self.url + path

    def kv_state(self) -> dict:
        return httpx.get(self.url + "/debug/kv_integrity", timeout=10).json()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the server; return its exit code. Raises if it or its engine outlives `timeout`."""
        children = child_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"tram serve hung on signal {sig}:\n{self.log()}") from None
        finally:
            self._log.close()
        deadline = time.time() + timeout
        while any(pid_alive(p) for p in children) and time.time() < deadline:
            time.sleep(0.1)
        orphans = [p for p in children if pid_alive(p)]
        for p in orphans:
            os.kill(p, signal.SIGKILL)
        if orphans:
            raise RuntimeError(f"engine process(es) {orphans} outlived the server")
        return code
