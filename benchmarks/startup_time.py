"""Start-up and shutdown times of Tram's processes: `LLM(model)` in a fresh interpreter (import
included), the same with tensor_parallel_size=2 and its shutdown(), and `tram serve` from launch to
the first 200 on /health. Prints the median of --runs runs of each.

    python3 benchmarks/startup_time.py [--model ../shared/models/stories260K] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tram.bench.report import machine_summary

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K"
LLM_SNIPPET = """
import json, time
start = time.perf_counter()
from tram import LLM
llm = LLM({model!r}, tensor_parallel_size={tp})
ready = time.perf_counter()
llm.llm_engine.engine_core.shutdown()
print(json.dumps([ready - start, time.perf_counter() - ready]))
"""


def llm_times(model: str, tp: int) -> tuple[float, float]:
    """(start, shutdown) seconds of one LLM in a fresh interpreter."""
    code = LLM_SNIPPET.format(model=model, tp=tp)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    start, stop = json.loads(done.stdout.strip().splitlines()[-1])
    return start, stop


def serve_time(model: str, port: int) -> float:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "tram", "serve", model, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                return time.perf_counter() - start
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"tram serve exited with code {proc.returncode}")
    finally:
        proc.terminate()
        proc.wait()


def report(name: str, runs: list[float]) -> None:
    print(f"{name}: median {statistics.median(runs):.2f} s (runs {', '.join(f'{r:.2f}' for r in runs)})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=38555)
    args = parser.parse_args()
    print(machine_summary(), flush=True)
    for tp in (1, 2):
        times = [llm_times(args.model, tp) for _ in range(args.runs)]
        report(f"LLM(tensor_parallel_size={tp}), import included", [t[0] for t in times])
        report("its shutdown()", [t[1] for t in times])
    report("tram serve: launch to /health 200", [serve_time(args.model, args.port) for _ in range(args.runs)])


if __name__ == "__main__":
    main()
