"""Host overhead of a step, measured with a sampling profiler (py-spy), not guessed.

Host overhead is everything in the engine's step but the model: scheduling, input preparation,
sampling, output processing and (in the server) IPC. The model is the forward pass and the logits
(every frame under tram/model/). py-spy samples the engine's thread at --rate Hz for --duration s
while the engine holds --num-running requests in steady decode, and each sample is charged to the
innermost category on its stack.

    pip install py-spy
    python3 benchmarks/host_overhead.py offline --model llama-15m --num-running 256
    python3 benchmarks/host_overhead.py offline --model llama-15m --num-running 256 --penalties
    python3 benchmarks/host_overhead.py server --model llama-15m --num-running 256

`offline` profiles LLMEngine.step in this process; `server` starts `tram serve`, keeps
--num-running streams open with the `tram bench serve` client and profiles the engine-core process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)

# Checked in order; the first category whose marker is on a sample's stack takes the sample.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("model (forward + logits)", ("tram/model/",)),
    ("sampling", ("tram/worker/sampler.py", "tram/worker/sampling_metadata.py", "tram/worker/logits_processors/")),
    (
        "input preparation",
        (
            "tram/worker/input_batch.py",
            "tram/worker/step_inputs.py",
            "tram/worker/block_table.py",
            "tram/worker/device_copy.py",
            "_update_states",
        ),
    ),
    ("scheduling", ("tram/core/",)),
    (
        "output processing",
        (
            "tram/engine/output_processor.py",
            "tram/engine/detokenizer.py",
            "tram/engine/stats.py",
            "tram/engine/llm_engine.py",
        ),
    ),
    ("IPC", ("tram/engine/messages.py", "tram/engine/ipc.py", "_drain_inputs", "_send (", "zmq/")),
]


def classify(stack: str) -> str:
    for name, markers in CATEGORIES:
        if any(m in stack for m in markers):
            return name
    return "other"


def summarize(raw_path: str) -> dict[str, float]:
    """py-spy's raw format: one line per distinct stack, 'frame;frame;... count'."""
    counts: collections.Counter[str] = collections.Counter()
    with open(raw_path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if stack and n.isdigit():
                counts[classify(stack)] += int(n)
    total = sum(counts.values())
    if not total:
        raise RuntimeError(f"py-spy recorded no samples in {raw_path}")
    return {k: v / total for k, v in counts.most_common()} | {"samples": float(total)}


def print_summary(title: str, shares: dict[str, float], ms_per_step: float | None = None) -> None:
    samples = int(shares.pop("samples"))
    print(f"\n{title}: {samples} samples")
    for name, share in shares.items():
        per_step = f"  {share * ms_per_step:7.2f} ms/step" if ms_per_step else ""
        print(f"  {name:<26} {100 * share:6.1f}%{per_step}")
    host = 1 - shares.get("model (forward + logits)", 0.0)
    per_step = f"  {host * ms_per_step:7.2f} ms/step" if ms_per_step else ""
    print(f"  {'host overhead (all but model)':<26} {100 * host:6.1f}%{per_step}")


def record(pid: int, duration: float, rate: int, out: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "py-spy",
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(duration)),
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            out,
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def steady_requests(args: argparse.Namespace, vocab: int) -> list:
    from tram.bench.datasets import random_requests

    # Outputs long enough that nobody finishes while profiled: the batch stays at num_running.
    return random_requests(args.num_running, (32, 512), (args.output_len, args.output_len), vocab, seed=0)


def offline(args: argparse.Namespace) -> None:
    import torch

    from tram import LLM
    from tram.bench.latency import prompts_done
    from tram.bench.presets import resolve_model
    from tram.sampling_params import RequestOutputKind, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(resolve_model(args.model), load_format="dummy", dtype=args.dtype, max_num_seqs=args.num_running)
    engine = llm.llm_engine
    vocab = engine.engine_core.config.model_config.vocab_size
    penalties = dict(repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5) if args.penalties else {}
    params = SamplingParams(
        temperature=0.0,
        max_tokens=args.output_len,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
        **penalties,
    )
    for i, r in enumerate(steady_requests(args, vocab)):
        engine.add_processed_request(str(i), None, r.prompt_token_ids, params)
    while not prompts_done(engine):
        engine.step()  # prefill everything first: the profile sees decode steps only
    raw = tempfile.mktemp(suffix=".txt")
    spy = record(os.getpid(), args.duration, args.rate, raw)
    steps, start = 0, time.perf_counter()
    while spy.poll() is None:
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    if spy.returncode != 0:
        sys.exit(f"py-spy failed: {spy.stderr.read().decode()}")
    ms_per_step = 1000 * elapsed / steps
    print(
        f"{steps} decode steps of {len(engine.engine_core.scheduler.running)} running requests, "
        f"{ms_per_step:.1f} ms per step (with the profiler attached)"
    )
    title = "offline LLMEngine.step" + (" (repetition, frequency and presence penalties)" if args.penalties else "")
    print_summary(title, summarize(raw), ms_per_step)
    engine.abort_request([str(i) for i in range(args.num_running)])


def server(args: argparse.Namespace) -> None:
    from tram.bench.presets import resolve_model
    from tram.bench.serve import benchmark, fetch_model_id
    from tram.bench.server_process import TramServer

    srv = TramServer(
        resolve_model(args.model),
        ["--load-format", "dummy", "--dtype", args.dtype, "--max-num-seqs", str(args.num_running)],
        timeout=300,
    )
    try:
        engine_pid = srv.engine_core_pid()
        reqs = steady_requests(args, 32000)
        model = asyncio.run(fetch_model_id(srv.url))
        load = threading.Thread(target=lambda: asyncio.run(benchmark(srv.url, model, reqs, warmup=0)), daemon=True)
        load.start()
        time.sleep(args.settle)  # let every prompt be prefilled before sampling
        raw = tempfile.mktemp(suffix=".txt")
        spy = record(engine_pid, args.duration, args.rate, raw)
        spy.wait()
        print_summary(f"server engine-core process (pid {engine_pid})", summarize(raw))
    finally:
        srv.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["offline", "server"])
    p.add_argument("--model", default="llama-15m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-running", type=int, default=256)
    p.add_argument("--output-len", type=int, default=480, help="prompt (<= 512) + output must fit the context")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--duration", type=float, default=15)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--settle", type=float, default=40, help="server mode: seconds of load before profiling")
    p.add_argument("--penalties", action="store_true", help="offline mode: every request uses all three penalties")
    args = p.parse_args()
    from tram.bench.report import machine_summary

    print(machine_summary())
    offline(args) if args.mode == "offline" else server(args)


if __name__ == "__main__":
    main()
