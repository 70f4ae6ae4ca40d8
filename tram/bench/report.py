"""What every benchmark report records about where it ran, and how reports are written.

`machine_info()` goes into every JSON report (`tram bench throughput|latency|serve`, and the scripts
under benchmarks/); `machine_summary()` is its one-line form for benchmarks that only print a table.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tram.bench.cpuinfo import cpu_info, cpu_summary
from tram.executor.cpu_threads import THREADS_VARS, WAIT_VARS

# Environment variables that set how many threads the model uses and how they wait: OpenMP's
# (PyTorch's CPU kernels and Tram's C++ kernels) and Tram's own (the engine-core process of `tram
# serve`), as the thread planner reads them. The wait policy moves timings on a shared machine many
# times over (docs/benchmarks.md). Recorded as set (None where unset), not as the planner parses them.
THREAD_ENV = (*THREADS_VARS, *WAIT_VARS)
_PACKAGES = ("triton", "transformers")


def machine_info() -> dict[str, Any]:
    """Date, platform, CPU (model, cores, ISA flags), thread settings, package versions and git revision.

    Call it when the benchmark runs (not at import): the torch thread count is the one in force then.
    """
    import torch

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_info(),
        "threads": thread_settings(),
        "versions": versions(),
        "git": git_revision(),
    }


def thread_settings() -> dict[str, Any]:
    """torch's intra- and inter-op thread counts, and the thread variables (None where unset)."""
    import torch

    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        **{name: os.environ.get(name) for name in THREAD_ENV},
    }


def versions() -> dict[str, str | None]:
    import torch

    import tram

    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "tram": tram.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for pkg in _PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def git_revision() -> dict[str, Any]:
    """The commit of the Tram checkout that ran, and whether it had uncommitted changes; {} outside one."""
    import tram

    root = Path(tram.__file__).resolve().parent.parent
    if not (root / ".git").exists():  # an installed package, not a checkout
        return {}

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    return {}


def device_info(device: Any) -> dict[str, Any]:
    """The accelerator a benchmark ran on (a torch.device); for the CPU, its model name and core count.

    Separate from machine_info: asking CUDA for properties creates a context on the GPU, which a
    parent process that only orchestrates children must not hold.
    """
    if device.type != "cuda":
        cpu = cpu_info()
        return {"type": "cpu", "name": cpu["model_name"] or platform.machine(), "cpu_count": os.cpu_count()}
    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "type": "cuda",
        "name": props.name,
        "total_memory_GiB": round(props.total_memory / 2**30, 2),
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
    }


def machine_summary() -> str:
    """One line for benchmarks that only print: the CPU and the thread settings."""
    threads = thread_settings()
    env = ", ".join(f"{k}={threads[k]}" for k in THREAD_ENV if threads[k] is not None)
    return f"machine: {cpu_summary()}; torch threads {threads['torch_threads']}" + (f", {env}" if env else "")


def json_safe(obj: Any) -> Any:
    """Infinite/NaN floats as strings: strict JSON has no such numbers (rate=inf is a common value)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: str | Path, data: Any) -> None:
    """Write a report as strict JSON; write then rename, so a reader (or a kill mid-write) never sees
    half a file. Values JSON does not know (a Path, a dtype) are written as their str()."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2, default=str) + "\n")
    tmp.replace(path)
