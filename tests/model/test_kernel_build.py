"""A C++ kernel build says what it does: before (where, about how long), during (a heartbeat), after
(how long); missing tools are named; `tram build-kernels` exits non-zero with a clear message."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from server_utils import REPO

from tram.model.kernels import build as kernel_build
from tram.model.kernels.cpu_kernels import CpuKernels, build_cpu_kernels, load_cpu_kernels
from tram.model.kernels.families import FAMILIES, family_of


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def build_log() -> list[str]:
    """The kernel build's log messages (tram's loggers do not propagate to pytest's caplog)."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("tram.model.kernels.build")
    log.addHandler(handler)
    yield messages
    log.removeHandler(handler)


def _fake_build(seconds: float, path: str) -> ModuleType:
    time.sleep(seconds)
    module = ModuleType("fake_kernels")
    module.__file__ = path
    return module


def test_a_build_logs_before_during_and_after(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch, build_log: list[str]
) -> None:
    monkeypatch.setattr(kernel_build, "HEARTBEAT_SECONDS", 0.1)
    kernel_build.build_with_progress("fake_kernels", lambda: _fake_build(0.45, "/x/fake_kernels.so"), "gguf")
    messages = build_log
    assert messages[0].startswith("Building the C++ CPU kernels (gguf)") and "usually about" in messages[0]
    assert str(fresh_cache / "fake_kernels") in messages[0]
    beats = [m for m in messages if m.startswith("still building the C++ CPU kernels (gguf)")]
    assert len(beats) >= 3 and beats[0].endswith("s so far")
    assert messages[-1].startswith("C++ CPU kernels (gguf) built in") and messages[-1].endswith("/x/fake_kernels.so")


def test_a_cached_build_loads_quietly(fresh_cache: Path, build_log: list[str]) -> None:
    (fresh_cache / "fake_kernels").mkdir()
    (fresh_cache / "fake_kernels" / "fake_kernels.so").write_bytes(b"")
    kernel_build.build_with_progress("fake_kernels", lambda: _fake_build(0.0, "/x/fake_kernels.so"))
    assert build_log == []


def test_expected_build_time_shrinks_with_cores_down_to_the_longest_file() -> None:
    for family in FAMILIES:
        assert kernel_build.expected_build_seconds(1, family) >= kernel_build.expected_build_seconds(2, family)
        assert kernel_build.expected_build_seconds(64, family) == kernel_build.expected_build_seconds(128, family) > 10
    # set-up builds the core alone: it is the short one
    assert kernel_build.expected_build_seconds(2, "core") < kernel_build.expected_build_seconds(2, "moe")


def test_each_family_exports_what_families_py_lists() -> None:
    kernels = load_cpu_kernels()
    assert kernels is not None
    for name, family in FAMILIES.items():
        module = kernels.family(name)
        exported = {n for n in dir(module) if not n.startswith("_")}
        assert exported == set(family.functions), name
        assert len(set(family.sources)) == len(family.sources)
    sources = [s for family in FAMILIES.values() for s in family.sources]
    assert len(sources) == len(set(sources))  # no file in two modules


def test_a_function_comes_from_its_family_and_is_kept() -> None:
    kernels = CpuKernels(load_cpu_kernels().family("core"))
    assert set(kernels._families) == {"core"}
    rms_norm = kernels.rms_norm
    assert "rms_norm" in vars(kernels) and kernels.rms_norm is rms_norm  # later lookups skip __getattr__
    assert kernels.gguf_x8_type is not None and set(kernels._families) == {"core", "gguf"}
    assert family_of("fused_moe") == "moe" and family_of("no_such_kernel") is None
    with pytest.raises(AttributeError, match="no 'no_such_kernel'"):
        kernels.no_such_kernel  # noqa: B018
    # the AMX switch reaches every family with tile code, loaded now or later
    allowed = kernels.cpu_amx()
    try:
        assert kernels.cpu_amx(False) is False
        assert kernels.family("moe").cpu_amx() is False and kernels.family("gguf").cpu_amx() is False
    finally:
        kernels.cpu_amx(allowed)
    assert kernels.family("moe").cpu_amx() == allowed


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="no kernel family"):
        build_cpu_kernels(["core", "fp4"])
    result = subprocess.run(
        [sys.executable, "-m", "tram", "build-kernels", "fp4"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and result.stderr.startswith("error: no kernel family ['fp4']"), result.stderr


def test_missing_compiler_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/no/such/g++")
    with pytest.raises(RuntimeError, match=r"missing a C\+\+ compiler \('/no/such/g\+\+'"):
        kernel_build.ensure_build_tools()


def test_ninja_beside_this_python_is_found_without_an_activated_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(here, "ninja")):
        pytest.skip("this Python has no ninja beside it")
    (tmp_path / "c++").symlink_to("/usr/bin/c++")
    monkeypatch.setenv("PATH", str(tmp_path))  # a compiler, but no ninja on PATH
    monkeypatch.delenv("CXX", raising=False)
    kernel_build.ensure_build_tools()
    assert os.environ["PATH"].split(os.pathsep)[0] == here


def test_build_kernels_command_fails_clearly_without_a_compiler() -> None:
    env = {**os.environ, "CXX": "/no/such/g++"}
    env.pop("TRAM_CPU_KERNELS", None)
    result = subprocess.run(
        [sys.executable, "-m", "tram", "build-kernels"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert "missing a C++ compiler" in lines[0] and "Traceback" not in result.stderr
    assert lines[-1].startswith("error: the C++ CPU kernels could not be built. Install g++ and ninja")


def test_build_kernels_command_reports_the_cached_build() -> None:
    # The suite's kernels are built by now (or this builds them, as set-up does).
    result = subprocess.run(
        [sys.executable, "-m", "tram", "build-kernels"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"C++ CPU kernels ({', '.join(FAMILIES)}) were already built")
    cache = result.stdout.strip().rsplit(": ", 1)[1]
    assert {name.rsplit("_", 1)[0] for name in os.listdir(cache)} >= {f"tram_cpu_kernels_{f}" for f in FAMILIES}
