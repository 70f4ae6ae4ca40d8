"""The CPU allocator settings keep freed memory mapped, so a repeated allocation pattern stops
page-faulting (tram/worker/cpu_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Fifty 1 MiB buffers allocated and freed four times. glibc's defaults return the freed top of the
# heap to the kernel each time, so every round faults all of it in again; with the settings the
# rounds after the first reuse it. bytearray is malloc underneath and writes every page it gets.
PATTERN = """
import resource, sys
from tram.worker.cpu_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "tuned" else False
bytearray(1 << 20)  # allocated and freed at once: lets glibc's dynamic mmap threshold settle at 1 MiB first
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    bufs = [bytearray(1 << 20) for _ in range(50)]
    del bufs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, sum(faults[1:]))
"""


def _run(mode: str, **env: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout.split()
    return out[0] == "True", int(out[1])


glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the settings are glibc's mallopt")


@glibc
def test_settings_stop_repeated_page_faults() -> None:
    applied, tuned = _run("tuned")
    _, default = _run("default")
    assert applied
    # Three rounds of 50 MiB are 38,400 pages; the defaults fault (nearly) all of them again.
    assert default > 30_000, default
    assert tuned < 1_000, tuned


@glibc
def test_environment_switch_keeps_glibc_defaults() -> None:
    applied, faults = _run("tuned", TRAM_CPU_MALLOC_TUNING="0")
    assert not applied
    assert faults > 30_000, faults


def test_model_runner_applies_the_settings_on_cpu(stories_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tram import LLM
    from tram.worker import model_runner

    calls = []
    monkeypatch.setattr(model_runner, "keep_freed_memory", lambda: calls.append(1) or True)
    LLM(stories_path, max_model_len=64)
    assert calls == [1]


@pytest.mark.parametrize("budget", [4096, 300])
def test_cpu_engine_warms_up_with_one_prompt_sized_step(
    stories_path: str, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """The heap grows once, at start, rather than in the first request's prefill."""
    from tram import LLM
    from tram.worker import model_runner

    expected = min(budget, model_runner.CPU_WARMUP_TOKENS)
    calls = []
    real = model_runner.run_dummy_step
    monkeypatch.setattr(
        model_runner, "run_dummy_step", lambda runner, n, rows: calls.append((n, rows)) or real(runner, n, rows)
    )
    llm = LLM(stories_path, max_model_len=256, max_num_batched_tokens=budget, max_num_seqs=8)
    assert calls == [(expected, 8)]
    out = llm.generate("Once upon a time", use_tqdm=False)
    assert out[0].outputs[0].token_ids  # the warm-up left the engine usable
