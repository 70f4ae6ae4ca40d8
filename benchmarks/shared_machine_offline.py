"""The offline half of benchmarks/shared_machine.py (`--mode offline`): `LLM.generate` on a machine it
shares with busy processes.

Each configuration runs in a fresh Python process, because libgomp reads OMP_WAIT_POLICY and
GOMP_SPINCOUNT once, when torch loads it: that process builds one `LLM`, warms it up, then for each
competing load (0, 1, 2 busy processes) times one `generate` of the whole workload and prints the result
as a JSON line. A `tN` configuration sets OMP_NUM_THREADS=N beside TRAM_CPU_THREADS=N, so that it
means N threads for an `LLM` that takes its threads from torch's default too (Tram before it chose
them). `--torch-first` imports torch before Tram, as a notebook or an application that uses
torch itself does, so that Tram comes too late to choose the wait policy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
from shared_machine import MODELS, THREAD_VARS, CompetingLoad, busy_cores, config_env, cpu_seconds

OFFLINE_METRICS = (
    ("wall_s", "wall s"),
    ("output_throughput", "out tok/s"),
    ("vs_quiet", "vs load 0"),
    ("cpu_ms_per_token", "CPU/tok ms"),
    ("load_cores", "load cores"),
    ("background_cores", "bg cores"),
)


def _llm_kwargs(model: str, dtype: str) -> dict[str, Any]:
    """The `tram serve` flags of MODELS as `LLM(...)` keywords."""
    extra = MODELS[model][1]
    kwargs: dict[str, Any] = {"dtype": dtype, "max_model_len": 512, "seed": 0}
    if "--load-format" in extra:
        kwargs["load_format"] = extra[extra.index("--load-format") + 1]
    return kwargs


def _engine_info(torch_first: bool) -> dict[str, Any]:
    """What the model really ran with: torch's threads and the wait variables of this process."""
    import torch

    env = {k: v for k in THREAD_VARS if (v := os.environ.get(k)) is not None}
    return {"torch_threads": torch.get_num_threads(), "engine_env": env, "torch_first": torch_first}


def _timed_generate(llm: Any, prompts: list[dict], params: list[Any], n_load: int, kind: str) -> dict[str, Any]:
    """One `generate` of the workload beside `n_load` busy processes, with its CPU accounting."""
    background = busy_cores()  # measured before our load starts: other people's processes
    load = CompetingLoad(n_load, kind)
    try:
        own0, load0, wall0 = cpu_seconds(os.getpid()), load.cpu_seconds(), time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - wall0
        own, got = cpu_seconds(os.getpid()) - own0, load.cpu_seconds() - load0
    finally:
        load.stop()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "load": n_load,
        "wall_s": wall,
        "output_tokens": tokens,
        "output_throughput": tokens / wall,
        "cpu_ms_per_token": 1000 * own / max(1, tokens),
        "load_cores": got / wall,
        "background_cores": background,
    }


def child(spec: dict[str, Any]) -> None:
    """Runs in the configuration's own process: one JSON line per competing load."""
    if spec["torch_first"]:
        import torch  # noqa: F401  (loads libgomp before Tram can choose its wait policy)
    from tram import LLM, SamplingParams
    from tram.bench.datasets import make_requests
    from tram.bench.presets import resolve_model

    model = spec["model"]
    llm = LLM(resolve_model(MODELS[model][0]), **_llm_kwargs(model, spec["dtype"]))
    requests = make_requests(
        spec["requests"], spec["input_len"], spec["output_len"], seed=0, vocab_size=MODELS[model][2]
    )
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up: kernels built, pool started
    info = _engine_info(spec["torch_first"])
    for n_load in spec["loads"]:
        result = _timed_generate(llm, prompts, params, n_load, spec["load_kind"])
        print("RESULT " + json.dumps({**result, **info}), flush=True)


def run_offline_config(model: str, config: str, args: argparse.Namespace, repeat: int) -> list[dict[str, Any]]:
    """One configuration's process; its results with the ratio to its own quiet run."""
    spec = {
        "model": model,
        "dtype": args.dtype,
        "requests": args.offline_requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "loads": args.loads,
        "load_kind": args.load_kind,
        "torch_first": args.torch_first,
    }
    env = {**os.environ, **config_env(config)}  # the shell's thread variables were removed in main()
    if "TRAM_CPU_THREADS" in env:  # tN means N threads for an LLM that reads only OMP_NUM_THREADS, too
        env["OMP_NUM_THREADS"] = env["TRAM_CPU_THREADS"]
    argv = [sys.executable, __file__, "--child", json.dumps(spec)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.offline_timeout)
    lines = [ln[len("RESULT ") :] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{model} {config}: the offline run failed:\n{proc.stderr[-3000:]}")
    log = [ln for ln in proc.stderr.splitlines() if "CPU thread" in ln or "GOMP_SPINCOUNT" in ln]
    results = [{**json.loads(ln), "model": model, "config": config, "repeat": repeat, "log": log} for ln in lines]
    quiet = next((r["output_throughput"] for r in results if r["load"] == 0), None)
    for r in results:
        r["vs_quiet"] = r["output_throughput"] / quiet if quiet else None
    return results


def print_offline_run(results: list[dict[str, Any]]) -> None:
    first = results[0]
    print(
        f"[{first['model']} {first['config']} run {first['repeat']}] torch threads {first['torch_threads']}, "
        f"env {first['engine_env']}; log: {first['log'][-1:] or 'none'}",
        flush=True,
    )
    for r in results:
        ratio = f", {r['vs_quiet']:.2f}x of load 0" if r["vs_quiet"] is not None else ""
        print(
            f"  load {r['load']} (background {r['background_cores']:.2f} cores): {r['wall_s']:.2f} s, "
            f"{r['output_throughput']:.0f} tok/s{ratio}, load got {r['load_cores']:.2f} cores",
            flush=True,
        )


def print_offline_table(results: list[dict[str, Any]]) -> None:
    """One row per (model, load, config); repeats side by side ('a / b')."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["model"], r["load"], r["config"]), []).append(r)
    print("\n| model | load | config | " + " | ".join(name for _, name in OFFLINE_METRICS) + " |")
    print("|---" * (3 + len(OFFLINE_METRICS)) + "|")
    for (model, n_load, config), rs in sorted(cells.items(), key=lambda kv: kv[0][:2]):
        row = [" / ".join(_fmt(r.get(key), key) for r in rs) for key, _ in OFFLINE_METRICS]
        print(f"| {model} | {n_load} | {config} | " + " | ".join(row) + " |")


def _fmt(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if key == "output_throughput" else f"{value:.2f}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        sys.exit("run benchmarks/shared_machine.py --mode offline")
