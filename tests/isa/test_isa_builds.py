"""The C++ kernels' tests on builds for other CPUs than this one: AVX2 alone (TRAM_CPU_MARCH=x86-64-v3),
the floor of the CPUs Tram serves on (AMD Zen 3 has no AVX-512), and AVX-512 without VNNI
(skylake-avx512: Skylake-SP, still common in clouds).

Why: the kernels keep separate code for targets without 512-bit registers (16-lane vectors as two
8-lane halves, csrc/simd_pair.h; AVX2 intrinsics in place of AVX-512 ones) and for AVX-512 without
VNNI (no vpdpbusd: the K-quants' row kernel alone), and the suite's own -march=native build compiles
only this CPU's. Each test builds the kernels again (about 3 minutes on 2 cores) and runs the kernel
tests against that build, so they carry the `isa_build` marker: the default run leaves them out and
`.ci/run` runs them after the suite. A test skips where this CPU cannot run its build, or where the
native build already is that build.
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
    "tests/model/test_pair_linear.py",
    "tests/model/test_cpu_attention_kernel.py",
    "tests/model/test_cpu_prefill_kernel.py",
    "tests/model/test_fp8_kv_cache.py",
    "tests/model/test_cpu_norm_rope_kernels.py",
    "tests/model/test_cpu_logits_kernels.py",
    "tests/model/test_cpu_moe_kernel.py",
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


def _kernel_tests_pass_on(march: str, vector_bits: int) -> None:
    env = {**os.environ, "TRAM_CPU_MARCH": march}
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
    bits = probe.stdout.split()[-1]
    assert bits == str(vector_bits), f"the {march} build targets {bits}-bit vectors"
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


def _x86() -> set[str]:
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86 target")
    return _cpu_flags()


def test_kernel_tests_pass_on_an_avx2_only_build() -> None:
    flags = _x86()
    if not {"avx2", "fma"} <= flags:
        pytest.skip("the CPU cannot run an AVX2 build")
    if "avx512f" not in flags:
        pytest.skip("without AVX-512 the suite's own (native) build is the AVX2 one")
    _kernel_tests_pass_on("x86-64-v3", 256)


def test_kernel_tests_pass_on_an_avx512_build_without_vnni() -> None:
    flags = _x86()
    if not {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        pytest.skip("the CPU cannot run a skylake-avx512 build")
    if "avx512_vnni" not in flags:
        pytest.skip("without VNNI the suite's own (native) build is the AVX-512 one without it")
    _kernel_tests_pass_on("skylake-avx512", 512)
