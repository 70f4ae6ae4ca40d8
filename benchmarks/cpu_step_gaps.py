"""Where a decode step's host time falls: the stretches between the C++ kernel calls of one step.

Between two OpenMP parallel regions libgomp's worker threads spin GOMP_SPINCOUNT times, then sleep on
a futex; waking them costs far more than the spin on a VM. Tram's engine core spins 3,000 times
(~0.1 ms; tram/executor/cpu_threads.py says why), so every stretch of Python and small PyTorch ops
longer than that between two kernels costs a sleep and a wake-up. This wraps every function of the
kernels module, runs --steps decode steps of one request (offline LLM, greedy), and prints one step's
calls with the host time before each, the stretches longer than --threshold-us, and per step: the
time in kernels, the rest, and the OpenMP worker's sleeps (voluntary context switches of the
process's other threads, from /proc).

    python3 benchmarks/cpu_step_gaps.py --model qwen3-30b-a3b-4l --gguf Q4_K_M --gguf-activations int8

--probe instead measures the wait itself: a parallel PyTorch op (an add over 4 MiB), then the main
thread busy for a fixed time, 300 times for each time; how often the worker slept, and what the
op and the gap cost together beyond the gap:

    GOMP_SPINCOUNT=3000 python3 benchmarks/cpu_step_gaps.py --probe

Run it with GOMP_SPINCOUNT=3000 in the environment for the engine core's wait, or 300000 (libgomp's
default, which never sleeps between a step's kernels) to see the host time alone. Small kernels that
run on one thread (norms, rotary, the router's choice) open no parallel region; the listing marks them
so that a stretch is read between the parallel ones.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
from cpu_decode_floor import gguf_file

from tram.model.kernels.families import FAMILIES

# Kernels that run inline at decode's few rows (no parallel region, so no wake-up before them).
INLINE = {"rms_norm", "add_rms_norm", "rotary_", "moe_route", "write_kv_cache_", "argmax_rows", "gguf_dequantize_"}


def thread_sleeps() -> dict[str, int]:
    """Voluntary context switches of each thread of this process."""
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(task + "/status") as f:
                status = f.read()
        except OSError:
            continue
        out[task] = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return out


def wrap_kernels(module: Any, log: list[tuple[str, float, float]]) -> None:
    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            log.append((name, start, time.perf_counter()))
            return result

        return timed

    for name in sorted({n for family in FAMILIES.values() for n in family.functions}):
        setattr(module, name, wrap(name, getattr(module, name)))  # builds a family not built yet
    # oneDNN's packed GEMM (past the row kernels' rows) is a kernel too, bound by name where it is called.
    import tram.model.layers.attention as attention
    import tram.model.layers.linear as linear
    import tram.model.layers.mlp as mlp

    packed = wrap("packed_linear", attention.packed_linear)
    for caller in (attention, linear, mlp):
        caller.packed_linear = packed


def print_step(log: list[tuple[str, float, float]], t0: float, t1: float, threshold_us: float) -> None:
    prev = t0
    for name, start, end in log:
        gap = (start - prev) * 1e6
        mark = " <<" if gap > threshold_us else ""
        kind = "" if name in INLINE else " (parallel)"
        at, took = (start - t0) * 1e3, (end - start) * 1e6
        print(f"  {at:8.3f} ms  host {gap:7.1f} us  kernel {took:8.1f} us  {name}{kind}{mark}")
        prev = end
    print(f"  end: host {(t1 - prev) * 1e6:.1f} us")


def probe(threads: int) -> None:
    """Worker sleeps and the cost of a parallel op after host gaps of 20-300 µs."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(1 << 20)
    main_task = f"/proc/self/task/{os.getpid()}"

    def others() -> int:
        return sum(v for k, v in thread_sleeps().items() if k != main_task)

    for _ in range(20):
        x.add(1)
    print(f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, {threads} threads")
    for gap_us in (20, 40, 60, 80, 100, 150, 300):
        calls, before, start = 300, others(), time.perf_counter()
        for _ in range(calls):
            x.add(1)
            until = time.perf_counter() + gap_us * 1e-6
            while time.perf_counter() < until:
                pass
        per_call = (time.perf_counter() - start) / calls * 1e6
        slept = (others() - before) / calls
        extra = per_call - gap_us
        print(f"  gap {gap_us:4d} us: worker sleeps {slept:.2f}; op + gap {per_call:.0f} us ({extra:.0f} beyond)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-30b-a3b-4l", help="a preset (its tokenizer) or a checkpoint")
    parser.add_argument("--gguf", help="a GGUF path, or a llama.cpp type of the preset (llama_cpp_peer.py's cache)")
    parser.add_argument("--gguf-activations", default="int8")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=40, help="timed decode steps (after 10 untimed)")
    parser.add_argument("--threads", type=int, default=2, help="TRAM_CPU_THREADS")
    parser.add_argument("--batch", type=int, default=1, help="requests decoding together")
    parser.add_argument("--context", type=int, default=64, help="each request's prompt tokens")
    parser.add_argument("--threshold-us", type=float, default=60.0, help="mark host stretches longer than this")
    parser.add_argument("--probe", action="store_true", help="measure the wait between parallel ops instead")
    args = parser.parse_args()
    if args.probe:
        probe(args.threads)
        return
    os.environ.setdefault("TRAM_CPU_THREADS", str(args.threads))

    from tram import LLM, SamplingParams
    from tram.bench.presets import is_config_only, resolve_model
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    tokenizer = resolve_model(args.model)
    extra: dict[str, Any] = {}
    path = tokenizer
    if args.gguf:
        path = gguf_file(args.gguf, args.model, 0)
        extra = {"tokenizer": tokenizer, "gguf_activations": args.gguf_activations}
    elif is_config_only(tokenizer):
        extra = {"load_format": "dummy"}
    max_len = args.context + args.steps + 64
    llm = LLM(path, dtype=args.dtype, max_model_len=max_len, seed=0, enable_prefix_caching=False, **extra)
    engine = llm.llm_engine
    log: list[tuple[str, float, float]] = []
    wrap_kernels(load_cpu_kernels(), log)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 12, ignore_eos=True)
    ids = [f"gaps{i}" for i in range(args.batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, {"prompt_token_ids": [7 + i] * args.context}, params)
    started: set[str] = set()
    while len(started) < len(ids):  # the prefills: until every request has its first token
        started.update(o.request_id for o in engine.step() if o.outputs and o.outputs[0].token_ids)
    for _ in range(10):  # untimed decode steps
        engine.step()
    steps, kernel_ms, sleeps = [], [], []
    for i in range(args.steps):
        log.clear()
        before = thread_sleeps()
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        after = thread_sleeps()
        main_task = f"/proc/self/task/{os.getpid()}"
        sleeps.append(sum(v - before.get(k, 0) for k, v in after.items() if k != main_task))
        steps.append((t1 - t0) * 1e3)
        kernel_ms.append(sum(end - start for _, start, end in log) * 1e3)
        if i == args.steps - 1:
            print(f"the last step, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}:")
            print_step(log, t0, t1, args.threshold_us)
    step, kernels = statistics.median(steps), statistics.median(kernel_ms)
    print(
        f"median of {args.steps} steps: {step:.2f} ms, of which kernels {kernels:.2f} ms and the rest "
        f"{step - kernels:.2f} ms; the other threads slept {statistics.mean(sleeps):.1f} times a step"
    )
    engine.abort_request(ids)


if __name__ == "__main__":
    main()
