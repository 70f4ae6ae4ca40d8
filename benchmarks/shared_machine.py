"""`tram serve` on a machine it shares: engine thread counts and OpenMP wait policies under a
competing CPU load.

For each model and engine configuration it starts `tram serve` once; then, for each competing load
(0, 1, 2 busy processes) and each client concurrency, it streams requests with `tram bench serve`'s
client and reports ITL p50/p99, TTFT p50/p99, output tok/s, the engine's CPU time per output token
(spinning shows up here) and how many cores the competing processes got meanwhile.

    python3 benchmarks/shared_machine.py            # stories260K: before, 2 threads, Tram's default (~3 min)
    python3 benchmarks/shared_machine.py --models stories260K,llama-15m \\
        --configs t2-spin300000,t2,t2-passive,default --repeats 2 --out shared.json

--configs: `default` sets no thread variable (Tram's own choice); `tN` sets TRAM_CPU_THREADS=N, and
suffixes add `-passive` / `-active` (OMP_WAIT_POLICY) or `-spinK` (GOMP_SPINCOUNT=K). libgomp's own
default, with neither variable set, is a spin count of 300000, so `t2-spin300000` is 2 threads as
they ran before Tram chose a policy. The thread variables of this shell are removed from the
servers' environment so that only --configs decides.
--load-kind: `spin` runs `python -c 'while True: pass'` (pure CPU); `matmul` a single-threaded numpy
256x256 float32 matmul loop (CPU plus cache and memory traffic).

--mode offline measures `LLM.generate` instead of a server (benchmarks/shared_machine_offline.py): each
configuration in a fresh process, one timed `generate` of --offline-requests requests per load, and
its throughput as a fraction of the same process's run at load 0 ("vs load 0").

    python3 benchmarks/shared_machine.py --mode offline --loads 0,1 --configs t2-spin300000,default --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)

THREAD_VARS = ("TRAM_CPU_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
MODELS = {  # name -> (path, extra `tram serve` arguments, vocabulary for random prompt ids)
    "stories260K": (str(_checkout.ROOT.parent / "shared" / "models" / "stories260K"), [], 512),
    "llama-15m": ("llama-15m", ["--load-format", "dummy"], 32000),
    "llama-110m": ("llama-110m", ["--load-format", "dummy"], 32000),
}
LOAD_PROGRAMS = {
    "spin": "while True: pass",
    "matmul": "import numpy as np\na = np.random.rand(256, 256).astype(np.float32)\nwhile True: a @ a",
}
METRICS = (
    ("p50_itl_ms", "ITL p50"),
    ("p99_itl_ms", "ITL p99"),
    ("p50_ttft_ms", "TTFT p50"),
    ("p99_ttft_ms", "TTFT p99"),
    ("output_throughput", "tok/s"),
    ("engine_cpu_ms_per_token", "eng CPU/tok"),
    ("load_cores", "load cores"),
    ("background_cores", "bg cores"),
)


def config_env(spec: str) -> dict[str, str]:
    """'t2-passive' -> {'TRAM_CPU_THREADS': '2', 'OMP_WAIT_POLICY': 'PASSIVE'}; 'default' -> {}."""
    if spec == "default":
        return {}
    head, *mods = spec.split("-")
    if not (head.startswith("t") and head[1:].isdigit()):
        raise ValueError(f"bad config {spec!r}: expected default or tN[-passive|-active|-spinK]")
    env = {"TRAM_CPU_THREADS": head[1:]}
    for mod in mods:
        if mod in ("passive", "active"):
            env["OMP_WAIT_POLICY"] = mod.upper()
        elif mod.startswith("spin") and mod[4:].isdigit():
            env["GOMP_SPINCOUNT"] = mod[4:]
        else:
            raise ValueError(f"bad config {spec!r}: unknown suffix {mod!r}")
    return env


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (clock ticks of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float = 1.0) -> float:
    """Cores the whole machine kept busy over `seconds` (/proc/stat). Measured while this benchmark's
    server is idle and its load not yet started, it is what other people's processes were using."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + iowait

    (total0, idle0), start = sample(), time.perf_counter()
    time.sleep(seconds)
    (total1, idle1), wall = sample(), time.perf_counter() - start
    return (total1 - total0 - (idle1 - idle0)) / os.sysconf("SC_CLK_TCK") / wall


def proc_env(pid: int, names: tuple[str, ...] = THREAD_VARS) -> dict[str, str]:
    """The thread variables as the process really got them (what libgomp read when it loaded)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.decode(errors="replace").partition("=") for item in f.read().split(b"\0") if item]
    return {k: v for k, _, v in pairs if k in names}


class CompetingLoad:
    """`n` busy processes of one kind, started at construction, stopped by stop()."""

    def __init__(self, n: int, kind: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.procs = [subprocess.Popen([sys.executable, "-c", LOAD_PROGRAMS[kind]], env=env) for _ in range(n)]
        time.sleep(0.5 if n else 0)  # running (and numpy imported) before the first request

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


@dataclass
class Cell:
    model: str
    config: str
    load: int
    concurrency: int


def run_cell(server: Any, cell: Cell, vocab: int, args: argparse.Namespace, load: CompetingLoad) -> dict[str, Any]:
    """One client run; the serve result plus CPU accounting and the load average."""
    from tram.bench.datasets import make_requests
    from tram.bench.serve import benchmark

    n = max(args.min_requests, args.requests_per_stream * cell.concurrency)
    requests = make_requests(n, args.input_len, args.output_len, seed=0, vocab_size=vocab)
    engine = server.engine_core_pid()
    loadavg = os.getloadavg()[0]
    eng0, load0, wall0 = cpu_seconds(engine), load.cpu_seconds(), time.perf_counter()
    result = asyncio.run(benchmark(server.url, "tram", requests, max_concurrency=cell.concurrency, warmup=2))
    wall = time.perf_counter() - wall0
    tokens = max(1, result["total_output_tokens"])
    result.update(
        vars(cell),
        loadavg_1min_before=loadavg,
        engine_cpu_ms_per_token=1000 * (cpu_seconds(engine) - eng0) / tokens,
        load_cores=(load.cpu_seconds() - load0) / wall,
    )
    for key in ("input_lens", "output_lens", "ttfts_ms", "e2els_ms", "machine"):
        result.pop(key, None)  # per-request lists and the machine: once per report is enough
    return result


def start_server(model: str, config: str, args: argparse.Namespace) -> Any:
    from tram.bench.presets import resolve_model
    from tram.bench.server_process import TramServer

    path, extra, _ = MODELS[model]
    serve_args = [*extra, "--dtype", args.dtype, "--max-model-len", "512", "--served-model-name", "tram"]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"shared_machine-{model}-{config}.log"
    return TramServer(resolve_model(path), serve_args, timeout=300, env=config_env(config), log_path=log)


def engine_report(server: Any) -> dict[str, Any]:
    """What the engine core really ran with: its environment and its own log line."""
    lines = [ln for ln in server.log().splitlines() if "CPU thread" in ln]
    return {"engine_env": proc_env(server.engine_core_pid()), "engine_log": lines[-1] if lines else None}


def run_config(model: str, config: str, args: argparse.Namespace, repeat: int) -> list[dict[str, Any]]:
    server = start_server(model, config, args)
    results = []
    try:
        info = engine_report(server)
        print(f"[{model} {config} run {repeat}] engine env {info['engine_env']}; {info['engine_log']}", flush=True)
        for n_load in args.loads:
            info["background_cores"] = busy_cores()
            load = CompetingLoad(n_load, args.load_kind)
            try:
                for conc in args.concurrency:
                    r = run_cell(server, Cell(model, config, n_load, conc), MODELS[model][2], args, load)
                    results.append({**r, **info, "repeat": repeat})
                    print(
                        f"  load {n_load} (background {info['background_cores']:.2f} cores) conc {conc:>3}: "
                        f"ITL p50 {r['p50_itl_ms']:.2f} p99 {r['p99_itl_ms']:.2f} ms, "
                        f"TTFT p50 {r['p50_ttft_ms']:.1f} ms, {r['output_throughput']:.0f} tok/s, "
                        f"failed {r['failed']}",
                        flush=True,
                    )
            finally:
                load.stop()
    finally:
        server.stop(strict=False)
    return results


def cell_text(values: list[float], key: str) -> str:
    fmt = "{:.0f}" if key == "output_throughput" else "{:.2f}" if key.endswith("cores") else "{:.1f}"
    return " / ".join(fmt.format(v) for v in values)


def print_table(results: list[dict[str, Any]]) -> None:
    """One row per (model, load, concurrency, config); repeats side by side ('a / b')."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["model"], r["load"], r["concurrency"], r["config"]), []).append(r)
    print("\n| model | load | conc | config | " + " | ".join(name for _, name in METRICS) + " |")
    print("|---" * (4 + len(METRICS)) + "|")
    for (model, n_load, conc, config), rs in sorted(cells.items(), key=lambda kv: kv[0][:3]):
        row = [cell_text([r[k] or 0.0 for r in rs], k) for k, _ in METRICS]
        print(f"| {model} | {n_load} | {conc} | {config} | " + " | ".join(row) + " |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="stories260K", help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--configs", default="t2-spin300000,t2,default", help="comma-separated (see above)")
    p.add_argument("--loads", default="0,1,2", help="numbers of competing busy processes")
    p.add_argument("--load-kind", choices=sorted(LOAD_PROGRAMS), default="spin")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--input-len", default="16:64", help="prompt length N or LO:HI (random token ids)")
    p.add_argument("--output-len", default="64", help="output length N or LO:HI (ignore_eos)")
    p.add_argument("--requests-per-stream", type=int, default=2, help="requests = this x concurrency ...")
    p.add_argument("--min-requests", type=int, default=8, help="... but at least this many")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=1, help="the whole matrix again (configs take turns)")
    p.add_argument("--out", help="write every result as JSON here")
    p.add_argument("--mode", choices=("serve", "offline"), default="serve", help="a server, or `LLM.generate`")
    p.add_argument("--offline-requests", type=int, default=16, help="offline: requests per timed generate")
    p.add_argument("--offline-timeout", type=float, default=900, help="offline: seconds per configuration")
    p.add_argument("--torch-first", action="store_true", help="offline: import torch before Tram")
    args = p.parse_args(argv)
    args.models, args.configs = args.models.split(","), args.configs.split(",")
    args.loads = [int(v) for v in args.loads.split(",")]
    args.concurrency = [int(v) for v in args.concurrency.split(",")]
    for model in args.models:
        if model not in MODELS:
            p.error(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    for config in args.configs:
        config_env(config)  # fail before starting anything
    return args


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every repeat of every model and configuration; configurations take turns."""
    from shared_machine_offline import print_offline_run, run_offline_config

    results: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for model in args.models:
            for config in args.configs:
                if args.mode == "offline":
                    results += (cell := run_offline_config(model, config, args, repeat))
                    print_offline_run(cell)
                else:
                    results += run_config(model, config, args, repeat)
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # A kill (not only Ctrl-C, which a background job ignores) still stops the server and the load.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    removed = {k: os.environ.pop(k) for k in THREAD_VARS if k in os.environ}
    if removed:
        print(f"removed from the servers' environment: {removed}", file=sys.stderr)
    from tram.bench.report import machine_info, machine_summary, write_json

    print(f"{machine_summary()}; load average {os.getloadavg()[0]:.2f} at start", flush=True)
    results = run_all(args)
    if args.mode == "offline":
        from shared_machine_offline import print_offline_table

        print_offline_table(results)
    else:
        print_table(results)
    if args.out:
        write_json(args.out, {"machine": machine_info(), "args": vars(args), "results": results})
        print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
