"""`tram.bench.report.machine_info`: the CPU, thread settings and versions every benchmark report records.

What it reports on this machine is checked against /proc/cpuinfo read here, independently, so the
test holds on any Linux machine; the parsers are also checked on canned lscpu and cpuinfo texts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tram.bench import cpuinfo
from tram.bench.cpuinfo import ISA_FLAGS, parse_lscpu, parse_proc_cpuinfo
from tram.bench.report import json_safe, machine_info, machine_summary, write_json

PROC = Path("/proc/cpuinfo")
needs_proc = pytest.mark.skipif(not PROC.exists(), reason="no /proc/cpuinfo on this system")


def proc_cpuinfo_fields() -> tuple[str | None, set[str] | None, int]:
    """(first model name, first flags, number of processors) straight from /proc/cpuinfo."""
    model, flags, count = None, None, 0
    for line in PROC.read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            count += 1
        elif key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and flags is None:
            flags = set(value.split())
    return model, flags, count


@needs_proc
def test_cpu_matches_proc_cpuinfo() -> None:
    model, flags, count = proc_cpuinfo_fields()
    cpu = machine_info()["cpu"]
    if model is not None:
        # lscpu's "Model name" is the kernel's "model name" (whitespace runs aside).
        assert " ".join(cpu["model_name"].split()) == " ".join(model.split())
    assert cpu["logical_cpus"] == count == os.cpu_count()
    assert 1 <= cpu["physical_cores"] <= cpu["logical_cpus"]
    assert 1 <= cpu["usable_cpus"] <= cpu["logical_cpus"]
    assert set(cpu["isa"]) == set(ISA_FLAGS)
    if flags is not None:
        assert cpu["isa"] == {f: f in flags for f in ISA_FLAGS}


def test_threads_and_versions_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("TRAM_CPU_THREADS", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    info = machine_info()
    assert info["threads"]["torch_threads"] == torch.get_num_threads()
    assert info["threads"]["OMP_NUM_THREADS"] == "3" and info["threads"]["TRAM_CPU_THREADS"] is None
    for key in ("date", "platform", "python", "torch", "cpu_count"):  # the fields reports had before
        assert info[key], key
    assert info["versions"]["torch"] == torch.__version__ and info["versions"]["transformers"]
    assert info["threads"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_NUM_THREADS=3" in machine_summary() and info["cpu"]["model_name"] in machine_summary()
    assert "OMP_WAIT_POLICY=PASSIVE" in machine_summary()
    json.dumps(info)  # a report must serialise as it is


def test_parse_lscpu_x86_and_arm() -> None:
    x86 = (
        "Architecture:            x86_64\nCPU(s):                  16\nModel name:              "
        "Intel(R) Xeon(R) Platinum 8480+\nThread(s) per core:      2\nCore(s) per socket:     4\n"
        "Socket(s):               2\nFlags:                   fpu avx2 fma avx512f amx_bf16\n"
    )
    assert parse_lscpu(x86) == {
        "model_name": "Intel(R) Xeon(R) Platinum 8480+",
        "logical_cpus": 16,
        "physical_cores": 8,
        "flags": ["fpu", "avx2", "fma", "avx512f", "amx_bf16"],
    }
    arm = "CPU(s):                  4\nModel name:              Neoverse-N1\nCore(s) per cluster:     4\n"
    assert parse_lscpu(arm) == {"model_name": "Neoverse-N1", "logical_cpus": 4, "physical_cores": 4, "flags": None}


def test_parse_proc_cpuinfo_counts_cores_not_threads() -> None:
    block = "processor\t: {i}\nmodel name\t: Test CPU\nphysical id\t: 0\ncore id\t\t: {c}\nflags\t\t: avx2 fma\n"
    text = "\n".join(block.format(i=i, c=i // 2) for i in range(4))  # 2 cores x 2 hyper-threads
    assert parse_proc_cpuinfo(text) == {
        "model_name": "Test CPU",
        "logical_cpus": 4,
        "physical_cores": 2,
        "flags": ["avx2", "fma"],
    }


def test_falls_back_to_proc_cpuinfo_without_lscpu(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "processor\t: 0\nmodel name\t: Fallback CPU\nflags\t\t: fma avx512f avx512vbmi\n"
    monkeypatch.setattr(cpuinfo, "_run_lscpu", lambda: None)
    monkeypatch.setattr(cpuinfo, "_read_proc_cpuinfo", lambda: text)
    cpuinfo._cpu_info.cache_clear()
    try:
        cpu = cpuinfo.cpu_info()
    finally:
        cpuinfo._cpu_info.cache_clear()
    assert cpu["model_name"] == "Fallback CPU" and cpu["source"] == "/proc/cpuinfo"
    assert cpu["isa"] == {
        "avx2": False,
        "fma": True,
        "avx512f": True,
        "avx512_vnni": False,
        "avx_vnni": False,
        "avx512vbmi": True,
        "avx512_bf16": False,
        "amx_bf16": False,
        "amx_int8": False,
    }


def test_write_json_is_strict_json(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.json"
    write_json(out, {"rate": float("inf"), "path": tmp_path, "rows": (1, 2)})
    assert json.loads(out.read_text()) == {"rate": "inf", "path": str(tmp_path), "rows": [1, 2]}
    assert json_safe([float("nan")]) == ["nan"]
    assert not list(out.parent.glob("*.tmp"))
