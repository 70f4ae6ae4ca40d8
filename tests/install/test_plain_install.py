"""A plain `pip install .` (no extras) in a fresh virtual environment serves: `tram serve` starts from
another directory and answers, and a command that needs an extra says which one to install.

It builds a whole environment (about a minute with a warm pip cache, plus the first start's C++
kernel build), so it carries the `install` marker: the default test run leaves it out and
`.ci/run` runs it after the suite.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import STORIES
from server_utils import free_port

pytestmark = pytest.mark.install
REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plain")
    env_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
    # torch first and pinned: the pin resolves to a local CPU wheel (an unpinned torch is a CUDA build).
    for step in (["torch==2.13.0"], [str(REPO)]):
        result = _run(pip + step, root, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return env_dir


def test_plain_install_has_no_extras(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    for extra_package in ("aiohttp", "matplotlib", "triton", "pytest"):
        probe = _run([python, "-c", f"import {extra_package}"], venv, timeout=120)
        assert probe.returncode != 0, f"{extra_package} should not come with a plain install"


def test_a_command_needing_an_extra_names_it(venv: Path) -> None:
    result = _run([str(venv / "bin" / "tram"), "bench", "serve", "--help"], venv, timeout=300)
    assert result.returncode != 0
    message = (result.stderr + result.stdout).strip().splitlines()
    assert message and "pip install 'tram[bench]'" in message[-1] and "aiohttp" in message[-1]
    assert "Traceback" not in result.stderr


def test_plain_install_serves_from_another_directory(venv: Path, tmp_path: Path) -> None:
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([str(venv / "bin" / "tram"), "serve", STORIES, "--port", str(port)],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        deadline = time.time() + 600  # the first start builds the C++ kernels for this install
        while time.time() < deadline:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            pytest.fail("tram serve did not come up:\n" + (tmp_path / "serve.log").read_text())
        body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).json()
        assert reply["usage"]["completion_tokens"] == 12 and reply["choices"][0]["text"].strip()
    finally:
        server.terminate()
        server.wait(30)
        log.close()
