"""The offline `LLM` runs its model in the user's process with the planner's CPU threads and OpenMP wait
policy (tram/entrypoints/offline_threads.py), as `tram serve` gives its engine core: the user's choices
win, and where torch loaded before Tram could shorten the spin, a warning says the fix.

The subprocess tests start a fresh Python, because libgomp reads its wait variables once, when torch
loads it; OMP_DISPLAY_ENV=VERBOSE makes libgomp print what it read at that moment. No timing here:
the measurements are benchmarks/shared_machine.py's (`--mode offline`, docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import STORIES

from tram.entrypoints.offline_threads import TorchThreads, plan
from tram.executor.cpu_threads import (
    DEFAULT_SPIN_COUNT,
    THREADS_VARS,
    WAIT_VARS,
    late_wait_warning,
    omp_runtime_loaded,
    usable_cores,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp and /proc are Linux's")
REPO = Path(__file__).resolve().parents[2]
# The child: `from tram import LLM` loads torch (its libgomp prints what it read, the first such block:
# torch's libgomp.so.1 loads before the copy sentencepiece's wheel brings), then the LLM sets the
# threads. It reports what the model got and what the environment kept.
CHILD = f"""
import json, os, sys
if sys.argv[1] == "torch-first":
    import torch
from tram import LLM
import torch
llm = LLM({STORIES!r}, max_model_len=128)
print(json.dumps({{"threads": torch.get_num_threads(), "env": {{k: os.environ.get(k) for k in {WAIT_VARS!r}}}}}))
"""


def run_child(env: dict[str, str], torch_first: bool = False) -> tuple[dict, str, str]:
    """The child's report, the spin count torch's libgomp read when it loaded, and the child's stderr."""
    clean = {k: v for k, v in os.environ.items() if k not in (*THREADS_VARS, *WAIT_VARS)}
    argv = [sys.executable, "-c", CHILD, "torch-first" if torch_first else "tram-first"]
    logs = {"TRAM_CONFIGURE_LOGGING": "1", "TRAM_LOGGING_LEVEL": "INFO"}  # the LLM's log line, on stderr
    full_env = {**clean, **logs, **env, "OMP_DISPLAY_ENV": "VERBOSE"}
    proc = subprocess.run(argv, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    at_load = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("GOMP_SPINCOUNT =")]
    return json.loads(proc.stdout.strip().splitlines()[-1]), at_load[0], proc.stderr


def test_llm_takes_the_planners_threads_and_short_spin() -> None:
    """The regression of issue 35 (9): with no variable set, the LLM gave the model every core and
    libgomp's 300,000-spin wait, a hundred times slower beside a busy process."""
    report, spin, stderr = run_child({})
    assert report["threads"] == usable_cores()  # every core until another process is busy (cpu_share.py)
    assert spin == f"GOMP_SPINCOUNT = '{DEFAULT_SPIN_COUNT}'"  # what torch's libgomp read
    assert report["env"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}  # not left for subprocesses
    assert usable_cores() == 1 or "while one is busy, leaving a core to other processes" in stderr


def test_users_variables_win() -> None:
    report, spin, stderr = run_child({"TRAM_CPU_THREADS": "2", "GOMP_SPINCOUNT": "50"})
    assert report["threads"] == 2 and spin == "GOMP_SPINCOUNT = '50'"
    assert report["env"]["GOMP_SPINCOUNT"] == "50"
    assert "set by the user" in stderr and "torch was imported before Tram" not in stderr


def test_torch_first_warns_with_the_fix() -> None:
    """torch imported before Tram: libgomp spins at its default; two threads get the warning."""
    report, spin, stderr = run_child({"TRAM_CPU_THREADS": "2"}, torch_first=True)
    assert report["threads"] == 2 and spin == "GOMP_SPINCOUNT = '300000'"
    assert "torch was imported before Tram" in stderr and f"GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT} python app.py" in stderr


@pytest.mark.parametrize("cores, threads, shared", [(1, 1, None), (2, 2, 1), (8, 8, 7)])
def test_plan_defaults(cores: int, threads: int, shared: int | None) -> None:
    policy = plan({}, cores, loaded_here=True)
    assert (
        policy.threads == threads
        and policy.shared_threads == shared
        and policy.env == {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}
    )
    assert late_wait_warning(policy) is None


def test_plan_late_libgomp_warns_only_for_a_team() -> None:
    team = plan({}, 8, loaded_here=False)
    assert team.env == {} and team.wait.startswith("libgomp's default")
    assert f"GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT}" in (late_wait_warning(team) or "")
    # on 2 cores the default gives a core up beside a busy process: one thread then waits for nobody
    assert late_wait_warning(plan({}, 2, loaded_here=False)) is None
    assert late_wait_warning(plan({"OMP_WAIT_POLICY": "PASSIVE"}, 8, loaded_here=False)) is None  # the user's


def test_plan_keeps_the_programs_torch_threads_unless_a_variable_says() -> None:
    assert plan({}, 8, True, programs_threads=3).threads == 3
    assert plan({}, 8, True, programs_threads=3).shared_threads is None  # the program's count is fixed
    assert "torch.set_num_threads(3)" in plan({}, 8, True, programs_threads=3).describe()
    assert plan({"OMP_NUM_THREADS": "5"}, 8, True, programs_threads=3).threads == 5


def test_programs_choice_is_a_count_neither_found_nor_set_by_tram() -> None:
    seen = TorchThreads(found=4)
    assert seen.programs_choice(4) is None and seen.programs_choice(2) == 2
    seen.ours = 3
    assert seen.programs_choice(3) is None


def test_omp_runtime_loaded_ignores_a_wheels_own_copy(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /site-packages/sentencepiece.libs/libgomp-6a29c32d.so.1.0.0\n")
    assert not omp_runtime_loaded(str(maps))
    maps.write_text(maps.read_text() + "7f02-7f03 r-xp 0 08:01 2 /site-packages/torch/lib/libgomp.so.1\n\n")
    assert omp_runtime_loaded(str(maps))
    assert not omp_runtime_loaded(str(tmp_path / "missing"))


def test_a_gpu_llm_drops_an_earlier_cpu_llms_watch() -> None:
    """Threads are the process's: a later LLM whose model is not this process's CPU work must not keep
    an earlier CPU LLM's watch setting torch's threads at its steps."""
    from types import SimpleNamespace

    from tram.entrypoints.offline_threads import apply
    from tram.executor import cpu_share

    cpu_share.install(2, 1, (os.getpid(),), lambda n: None)
    gpu = SimpleNamespace(
        model_config=SimpleNamespace(device_type="cuda"), parallel_config=SimpleNamespace(world_size=1)
    )
    assert apply(gpu) is None  # type: ignore[arg-type]
    assert cpu_share.installed() is None
