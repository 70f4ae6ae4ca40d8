"""Time one `OutputProcessor.process_outputs` step for many streams, by output kind and by the
length already generated, with the real tokenizer and synthetic core outputs (no model).

    python3 benchmarks/output_processing.py                       # 64 streams, 256 and 8,192 tokens
    python3 benchmarks/output_processing.py --streams 64 --histories 256 4096 --steps 100

Each stream first generates `history` tokens (fed in chunks of 256 per step), then runs single-token
steps as decoding does. Reported: the median over `--steps` timed steps of the wall time and of the
thread's CPU time (on a shared machine the CPU time is the steadier of the two: it leaves out the
time the process waited for a core). The script also runs on code from before RequestOutputKind
(commit 991234f), where FINAL_ONLY was the `final_only=True` argument of `add_request` and DELTA
did not exist.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Time the checkout this script belongs to, not whichever tram is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    from tram.engine.messages import EngineCoreOutput, LogprobsLists  # noqa: E402
except ImportError:  # the code before the message module (991234f), for before/after runs
    from tram.core.outputs import EngineCoreOutput, LogprobsLists  # noqa: E402
from tram.engine.output_processor import OutputProcessor  # noqa: E402
from tram.engine.tokenizer import load_tokenizer  # noqa: E402
from tram.sampling_params import SamplingParams  # noqa: E402

try:
    from tram.sampling_params import RequestOutputKind

    KINDS = [k.name for k in RequestOutputKind]
except ImportError:  # before RequestOutputKind
    RequestOutputKind = None
    KINDS = ["CUMULATIVE", "FINAL_ONLY"]

MODEL = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "stories260K"))
STORY = "Once upon a time there was a little girl named Lily. She loved to play outside in the sun. "
WARMUP_CHUNK = 256


def core_output(rid: str, ids: list[int], top: int, vocab: int) -> EngineCoreOutput:
    lps = None
    if top:
        rows = [[t] + [(t + k) % vocab for k in range(1, top + 1)] for t in ids]
        values = [[-0.25 - 0.5 * k for k in range(top + 1)] for _ in ids]
        lps = LogprobsLists(rows, values, [1] * len(ids))
    return EngineCoreOutput(rid, ids, new_logprobs=lps)


def make_processor(tokenizer: Any, kind: str, streams: int, top: int, stop: list[str]) -> OutputProcessor:
    proc = OutputProcessor(tokenizer)
    params = SamplingParams(max_tokens=None, logprobs=top or None, stop=stop)
    extra: dict[str, Any] = {}
    if RequestOutputKind is not None:
        params.output_kind = RequestOutputKind[kind]
    elif kind == "FINAL_ONLY":
        extra["final_only"] = True
    prompt = tokenizer.encode("Once upon a time")
    for s in range(streams):
        proc.add_request(f"r{s}", None, prompt, params, [f"r{s}"], time.time(), **extra)
    return proc


def run(tokenizer: Any, kind: str, history: int, top: int, args: argparse.Namespace) -> tuple[float, float]:
    """Median (wall, CPU) milliseconds of one process_outputs step after `history` tokens per stream."""
    ids = tokenizer.encode(STORY * 8, add_special_tokens=False)
    vocab = len(tokenizer)
    proc = make_processor(tokenizer, kind, args.streams, top, args.stop)

    def step(start: int, size: int) -> list[EngineCoreOutput]:
        chunk = [ids[(start + i) % len(ids)] for i in range(size)]
        return [core_output(f"r{s}", chunk, top, vocab) for s in range(args.streams)]

    done = 0
    while done < history - args.steps:
        size = min(WARMUP_CHUNK, history - args.steps - done)
        proc.process_outputs(step(done, size))
        done += size
    for _ in range(args.steps):  # single-token steps, untimed, as decoding would have produced
        proc.process_outputs(step(done, 1))
        done += 1
    wall, cpu = [], []
    for _ in range(args.steps):
        outputs = step(done, 1)
        t0, c0 = time.perf_counter(), time.thread_time()
        emitted, _ = proc.process_outputs(outputs)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        del emitted
        proc.take_iteration_stats()  # the server takes them after every step
        done += 1
    del proc
    gc.collect()
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def _machine() -> str:
    """The machine line every benchmark prints (CPU model, ISA flags, threads)."""
    try:
        from tram.bench.report import machine_summary
    except ImportError:  # a checkout from before machine_summary (991234f): the CPU's own words
        import platform

        return f"machine: {platform.processor() or platform.machine()} (see lscpu)"
    return machine_summary()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=MODEL, help="tokenizer folder (default: stories260K)")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument(
        "--histories",
        type=int,
        nargs="+",
        default=[256, 8192],
        help="tokens already generated per stream when timing starts",
    )
    p.add_argument("--steps", type=int, default=50, help="timed single-token steps per configuration")
    p.add_argument("--logprobs", type=int, nargs="+", default=[0, 5], help="top logprobs per token (0: none)")
    p.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    p.add_argument("--stop", nargs="*", default=[], help="stop strings (never matched by the story)")
    args = p.parse_args()
    tokenizer = load_tokenizer(args.model)
    print(_machine())
    print(f"{args.streams} streams; ms per process_outputs step, median of {args.steps}: wall / CPU")
    print("| output kind | logprobs | " + " | ".join(f"{h:,} tokens" for h in args.histories) + " |")
    print("|---|---|" + "---|" * len(args.histories))
    for kind in args.kinds:
        for top in args.logprobs:
            cells = []
            for history in args.histories:
                wall, cpu = run(tokenizer, kind, history, top, args)
                cells.append(f"{wall:.2f} / {cpu:.2f}")
            print(f"| {kind} | {top or '-'} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
