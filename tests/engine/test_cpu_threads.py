"""The engine core's CPU threads and OpenMP wait policy follow the rules of tram/executor/cpu_threads.py:
the user's variables win, Tram's defaults fill in only what the user left unset. No timing here; the
measurements are benchmarks/shared_machine.py's (docs/benchmarks.md, "Sharing the machine")."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from tram.config import ParallelConfig
from tram.executor import cpu_share
from tram.executor.cpu_threads import DEFAULT_SPIN_COUNT, choose_cpu_threads, environment

TRAM_DEFAULT_ENV = {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}


@pytest.mark.parametrize("cores, threads, shared", [(1, 1, None), (2, 2, 1), (3, 3, 2), (16, 16, 15)])
def test_defaults_follow_the_machine_with_a_short_spin(cores: int, threads: int, shared: int | None) -> None:
    """Every core while other processes leave them free, one fewer while one is busy (cpu_share.py)."""
    policy = choose_cpu_threads({"PATH": "/bin"}, cores)
    assert policy.threads == threads and policy.shared_threads == shared and policy.env == TRAM_DEFAULT_ENV
    assert "Tram's default" in policy.describe() and "default:" in policy.describe()


@pytest.mark.parametrize(
    "environ, threads",
    [
        ({"TRAM_CPU_THREADS": "1"}, 1),
        ({"OMP_NUM_THREADS": "3"}, 3),
        ({"TRAM_CPU_THREADS": "1", "OMP_NUM_THREADS": "4"}, 1),  # Tram's own variable first
        ({"TRAM_CPU_THREADS": "", "OMP_NUM_THREADS": "4"}, 4),  # an empty variable counts as unset
        ({"TRAM_CPU_THREADS": "0"}, 1),
    ],
)
def test_user_thread_count_wins(environ: dict[str, str], threads: int) -> None:
    policy = choose_cpu_threads(environ, cores=2)
    assert policy.threads == threads and policy.shared_threads is None  # the user's count is fixed
    assert policy.env == TRAM_DEFAULT_ENV  # a thread count alone does not say how threads wait


@pytest.mark.parametrize(
    "environ",
    [
        {"OMP_WAIT_POLICY": "ACTIVE"},
        {"OMP_WAIT_POLICY": "passive"},
        {"GOMP_SPINCOUNT": "300000"},
        {"GOMP_SPINCOUNT": "infinite", "TRAM_CPU_THREADS": "2"},
    ],
)
def test_user_wait_policy_is_never_overridden(environ: dict[str, str]) -> None:
    policy = choose_cpu_threads(environ, cores=2)
    assert policy.env == {}
    assert "set by the user" in policy.describe()


def test_bad_thread_count_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="TRAM_CPU_THREADS must be a whole number"):
        choose_cpu_threads({"TRAM_CPU_THREADS": "two"}, cores=2)


def test_environment_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with environment({"GOMP_SPINCOUNT": "10", "OMP_WAIT_POLICY": "PASSIVE"}):
        assert os.environ["GOMP_SPINCOUNT"] == "10" and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "GOMP_SPINCOUNT" not in os.environ and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.parametrize(
    "added, expected",
    [
        ({"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}, "Tram's default"),  # the API server added it
        ({}, "set by the user"),  # the same value, but it was there before the API server
    ],
)
def test_engine_core_applies_and_logs_the_policy(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, added: dict[str, str], expected: str
) -> None:
    import torch

    from tram.engine.core_proc import _set_cpu_threads

    for name in ("TRAM_CPU_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", str(DEFAULT_SPIN_COUNT))
    monkeypatch.setattr("tram.engine.core_proc.usable_cores", lambda: 3)
    config = SimpleNamespace(model_config=SimpleNamespace(device_type="cpu"), parallel_config=ParallelConfig())
    monkeypatch.setattr(logging.getLogger("tram"), "propagate", True)  # Tram's own handler keeps it from caplog
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="tram.engine.core_proc"):
            _set_cpu_threads(config, added, os.getppid())  # type: ignore[arg-type]
        assert torch.get_num_threads() == 3  # every core, until another process is busy
        watch = cpu_share.installed()
        assert watch is not None and (watch.full, watch.shared) == (3, 2)
        assert watch.own_pids == (os.getpid(), os.getppid())  # the engine core and its API server
    finally:
        cpu_share.uninstall()
        torch.set_num_threads(threads)
    assert expected in caplog.text and "3 CPU thread(s)" in caplog.text


def test_a_replica_share_is_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from tram.engine.core_proc import _set_cpu_threads

    for name in ("TRAM_CPU_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    config = SimpleNamespace(
        model_config=SimpleNamespace(device_type="cpu"), parallel_config=ParallelConfig(cpu_threads=1)
    )
    threads = torch.get_num_threads()
    try:
        _set_cpu_threads(config, {}, os.getppid())  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1 and cpu_share.installed() is None
    finally:
        torch.set_num_threads(threads)
