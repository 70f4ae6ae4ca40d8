"""The C++ kernels' tests on a build for AVX2 alone (TRAM_CPU_MARCH=x86-64-v3), the floor of the CPUs
Tram serves on (AMD Zen 3 has no AVX-512).

Why: the kernels keep separate code for targets without 512-bit registers (16-lane vectors as two
8-lane halves, csrc/simd_pair.h; AVX2 intrinsics in place of AVX-512 ones), and on a CPU with AVX-512
the suite's own -march=native build never compiles it. This test builds the kernels a second time
(about 2.5 minutes on 2 cores) and runs the kernel tests against that build, so it carries the
`isa_build` marker: the default run leaves it out and `.ci/run` runs it after the suite. On a CPU
without AVX-512 the suite's own build is the AVX2 one, and the test skips.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.isa_build
REPO = Path(__file__).resolve().parents[2]
KERNEL_TESTS = [
    "tests/model/test_cpu_linear_kernel.py",
    "tests/model/test_cpu_packed_linear.py",
    "tests/model/test_cpu_attention_kernel.py",
    "tests/model/test_cpu_prefill_kernel.py",
    "tests/model/test_fp8_kv_cache.py",
    "tests/model/test_cpu_norm_rope_kernels.py",
    "tests/model/test_cpu_logits_kernels.py",
    "tests/quant",
]


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_kernel_tests_pass_on_an_avx2_only_build() -> None:
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64-v3 is an x86 target")
    flags = _cpu_flags()
    if not {"avx2", "fma"} <= flags:
        pytest.skip("the CPU cannot run an AVX2 build")
    if "avx512f" not in flags:
        pytest.skip("without AVX-512 the suite's own (native) build is the AVX2 one")
    env = {**os.environ, "TRAM_CPU_MARCH": "x86-64-v3"}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tram.model.kernels.cpu_kernels import build_cpu_kernels; print(build_cpu_kernels().vector_bits())",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert probe.returncode == 0, probe.stderr[-4000:]
    assert probe.stdout.split()[-1] == "256", f"the x86-64-v3 build targets {probe.stdout.split()[-1]}-bit vectors"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
