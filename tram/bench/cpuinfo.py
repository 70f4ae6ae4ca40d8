"""The CPU a benchmark ran on: model name, core counts and the ISA extensions Tram's CPU path cares about.

CPU timings mean little without these: the C++ kernels and PyTorch's own pick their code paths by
AVX2/FMA, AVX-512 and the bf16 extensions, and a shared VM can show any mix of them. `lscpu` is asked
first (it names the model and topology the same way on every Linux), then /proc/cpuinfo; elsewhere
only what the standard library knows is recorded.
"""

from __future__ import annotations

import copy
import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

# The extensions that change which kernels run: AVX2 + FMA (the C++ kernels' baseline), AVX-512
# (wider vectors), the int8 dot products and byte permutes of the int8-activation GGUF kernels
# (avx512_vnni or avx_vnni, avx512vbmi), and the bf16 dot-product / matrix instructions that make
# bfloat16 fast. Spelled as Linux lists them: "avx512vbmi" has no underscore where "avx512_vnni" has
# one (asking for "avx512_vbmi" reported it missing on CPUs that have it).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512vbmi", "avx512_bf16", "amx_bf16", "amx_int8")


def parse_lscpu(text: str) -> dict[str, Any]:
    """`lscpu` output (C locale) -> model name, logical CPUs, physical cores, flags."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first "Model name" is the CPU's (ARM may list a BIOS one later)
            fields[key.strip()] = value.strip()
    logical = _int(fields.get("CPU(s)"))
    per_socket = _int(fields.get("Core(s) per socket") or fields.get("Core(s) per cluster"))
    sockets = _int(fields.get("Socket(s)") or fields.get("Cluster(s)")) or 1
    return {
        "model_name": fields.get("Model name"),
        "logical_cpus": logical,
        "physical_cores": per_socket * sockets if per_socket else None,
        "flags": fields["Flags"].split() if "Flags" in fields else None,
    }


def parse_proc_cpuinfo(text: str) -> dict[str, Any]:
    """/proc/cpuinfo -> the same fields as parse_lscpu (x86 names; ARM calls its flags 'Features')."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    processors = []
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        if "processor" in fields:
            processors.append(fields)
    if not processors:
        return {"model_name": None, "logical_cpus": None, "physical_cores": None, "flags": None}
    first = processors[0]
    # A core is a (package, core) pair; hyper-threads share one. Without those fields, count processors.
    cores = {(p.get("physical id"), p.get("core id")) for p in processors if "core id" in p}
    flags = first.get("flags") or first.get("Features")
    return {
        "model_name": first.get("model name") or first.get("Processor") or first.get("cpu model"),
        "logical_cpus": len(processors),
        "physical_cores": len(cores) or len(processors),
        "flags": flags.split() if flags is not None else None,
    }


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _run_lscpu() -> str | None:
    if shutil.which("lscpu") is None:
        return None
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=10, env={**os.environ, "LC_ALL": "C"}
        )  # English field names
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _read_proc_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpu_info() -> dict[str, Any]:
    """Model name, logical CPUs, physical cores, the CPUs this process may use, and ISA_FLAGS present
    or not (None where the flags could not be read)."""
    return copy.deepcopy(_cpu_info())


@functools.lru_cache(maxsize=1)  # the CPU does not change under a process; lscpu is a subprocess
def _cpu_info() -> dict[str, Any]:
    parsed, source = _from_lscpu_or_proc()
    if parsed is None:
        parsed, source = (
            {
                "model_name": platform.processor() or None,
                "logical_cpus": os.cpu_count(),
                "physical_cores": None,
                "flags": None,
            },
            "platform",
        )
    flags = parsed.pop("flags")
    # A container or taskset may allow fewer CPUs than the machine has: that is what threads can use.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        **parsed,
        "usable_cpus": usable,
        "source": source,
        "isa": {f: (f in flags) if flags is not None else None for f in ISA_FLAGS},
    }


def _from_lscpu_or_proc() -> tuple[dict[str, Any] | None, str]:
    """lscpu's fields, with /proc/cpuinfo filling what lscpu left out (old versions print no flags)."""
    text = _run_lscpu()
    parsed = parse_lscpu(text) if text else None
    if parsed is not None and parsed["model_name"] is not None and parsed["flags"] is not None:
        return parsed, "lscpu"
    proc = _read_proc_cpuinfo()
    if proc is None:
        return parsed, "lscpu"
    fallback = parse_proc_cpuinfo(proc)
    if parsed is None:
        return fallback, "/proc/cpuinfo"
    return {k: v if v is not None else fallback[k] for k, v in parsed.items()}, "lscpu+/proc/cpuinfo"


def cpu_summary(info: dict[str, Any] | None = None) -> str:
    """One line for a printed header: 'AMD EPYC, 2 cores / 2 CPUs (2 usable), avx2 fma ... (no amx_bf16)'."""
    info = info or cpu_info()
    present = [f for f, ok in info["isa"].items() if ok]
    absent = [f for f, ok in info["isa"].items() if ok is False]
    isa = " ".join(present) + (f" (no {' '.join(absent)})" if absent else "")
    return (
        f"{info['model_name']}, {info['physical_cores']} cores / {info['logical_cpus']} CPUs "
        f"({info['usable_cpus']} usable), {isa or 'ISA flags unknown'}"
    )
