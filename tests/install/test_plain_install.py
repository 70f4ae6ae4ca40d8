"""A plain `pip install .` (no extras) in a fresh virtual environment serves: `tram serve` starts from
another directory and answers, and a command that needs an extra says which one to install.

The first ten minutes on a fresh machine (an empty TORCH_EXTENSIONS_DIR stands for one): a first
start that must build the C++ kernels says so, with progress, and says Ready only when it answers;
after set-up's build of the core kernels (as scripts/setup.sh runs it) the first start answers
/health within FIRST_START_SECONDS, and a GGUF file's first start builds the GGUF family, saying so.

It builds a whole environment (about a minute with a warm pip cache), the core kernels twice (about
40 s each on 2 cores) and the GGUF family once (about 60 s), so it carries the `install` marker: the
default test run leaves it out and `.ci/run` runs it after the suite.
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
FIRST_START_SECONDS = 60  # from `tram serve` to /health 200 once set-up has built the kernels


def _run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


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
    # triton is the gpu extra's, but xgrammar (structured outputs, a core feature) requires it on
    # Linux x86_64, so a plain install there has it anyway; it is not checked here.
    python = str(venv / "bin" / "python")
    for extra_package in ("aiohttp", "matplotlib", "pytest"):
        probe = _run([python, "-c", f"import {extra_package}"], venv, timeout=120)
        assert probe.returncode != 0, f"{extra_package} should not come with a plain install"
    # The grammar engines, and what GGUF files and compressed-tensors checkpoints need.
    for core_package in ("xgrammar", "llguidance", "gguf", "compressed_tensors"):
        probe = _run([python, "-c", f"import {core_package}"], venv, timeout=120)
        assert probe.returncode == 0, f"{core_package} must come with a plain install: {probe.stderr[-500:]}"


def test_a_command_needing_an_extra_names_it(venv: Path) -> None:
    result = _run([str(venv / "bin" / "tram"), "bench", "serve", "--help"], venv, timeout=300)
    assert result.returncode != 0
    message = (result.stderr + result.stdout).strip().splitlines()
    assert message and "pip install 'tram-llm[bench]'" in message[-1] and "aiohttp" in message[-1]
    assert "Traceback" not in result.stderr


def _env(extensions_dir: Path) -> dict[str, str]:
    """This environment, with its own torch extension cache (empty: a machine that never built them)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "TORCH_EXTENSIONS_DIR": str(extensions_dir), "PYTHONUNBUFFERED": "1"}


def _serve_until_healthy(
    venv: Path, cwd: Path, env: dict[str, str], timeout: float, model: str = STORIES
) -> tuple[float, str]:
    """Start `tram serve model` in `cwd`; (seconds until /health answered 200, its log). A completion works."""
    port = free_port()
    log_path = cwd / "serve.log"
    with open(log_path, "w") as log:
        start = time.monotonic()
        server = subprocess.Popen(
            [str(venv / "bin" / "tram"), "serve", model, "--port", str(port)],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            while time.monotonic() - start < timeout:
                assert server.poll() is None, log_path.read_text()
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            else:
                pytest.fail(f"tram serve did not answer /health within {timeout} s:\n" + log_path.read_text())
            elapsed = time.monotonic() - start
            body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).json()
            assert reply["usage"]["completion_tokens"] == 12 and reply["choices"][0]["text"].strip()
        finally:
            server.terminate()
            server.wait(30)
    return elapsed, log_path.read_text()


def test_a_first_start_that_builds_the_kernels_says_so(venv: Path, tmp_path: Path) -> None:
    _, log = _serve_until_healthy(venv, tmp_path, _env(tmp_path / "no-kernels-yet"), timeout=900)
    built_core = ["Building the C++ CPU kernels (core)", "C++ CPU kernels (core) built in"]
    order = ["starting: loading", *built_core, "Ready: http"]
    positions = [log.find(marker) for marker in order]
    assert -1 not in positions and positions == sorted(positions), log
    assert "usually about" in log and "serving on" not in log
    built = float(log.split("C++ CPU kernels (core) built in ")[1].split(" s")[0])
    if built > 16:  # the heartbeat comes every 15 s
        assert "still building the C++ CPU kernels" in log, log


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The torch extension cache that set-up's build fills (the next test), shared by the tests after
    it so that the kernels build once."""
    return tmp_path_factory.mktemp("kernels")


def test_after_set_up_the_first_start_answers_quickly(venv: Path, tmp_path: Path, kernels_dir: Path) -> None:
    # scripts/setup.sh builds the core family (`tram build-kernels core`); here, in the fresh environment.
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert 'python3 -m tram.model.kernels.build "${families[@]}"' in setup and "families=(core)" in setup
    env = _env(kernels_dir)
    built = _run([str(venv / "bin" / "tram"), "build-kernels", "core"], tmp_path, timeout=900, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert built.stdout.startswith("C++ CPU kernels (core) built in") and str(kernels_dir) in built.stdout
    elapsed, log = _serve_until_healthy(venv, tmp_path, env, timeout=FIRST_START_SECONDS)
    assert "Building the C++ CPU kernels" not in log, log
    print(f"first start after set-up: /health 200 after {elapsed:.1f} s")


def test_a_plain_install_serves_a_gguf_file(venv: Path, tmp_path: Path, kernels_dir: Path) -> None:
    """No extra for GGUF: the file llama.cpp's converter writes from stories260K is served as is."""
    from gguf_tools import convert  # llama.cpp's converter; the test skips, saying how, without it

    model = convert(STORIES, tmp_path / "stories260K-q8_0.gguf", "q8_0")
    _, log = _serve_until_healthy(venv, tmp_path, _env(kernels_dir), timeout=900, model=str(model))
    # set-up left the GGUF family out: this first start builds it, saying so, before Ready
    order = ["Building the C++ CPU kernels (gguf)", "C++ CPU kernels (gguf) built in", "Ready: http"]
    positions = [log.find(marker) for marker in order]
    assert -1 not in positions and positions == sorted(positions), log
    assert "Building the C++ CPU kernels (core)" not in log, log
