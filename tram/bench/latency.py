"""`tram bench latency`: one batch of fixed size and lengths; end-to-end and per-step latency.

    tram bench latency --model llama-15m --batch-size 8 --input-len 128 --output-len 128

Each iteration submits the whole batch at once and steps the engine until every request is done.
Steps that ran prompt tokens are reported as prefill steps, the rest as decode steps. `--prefill`
times the first token instead, of Tram and its peers side by side (tram/bench/prefill.py).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from tram.bench.datasets import random_requests
from tram.bench.prefill import add_prefill_flags, run_prefill
from tram.bench.report import machine_info, machine_summary, write_json
from tram.bench.throughput import add_engine_flags, model_checkpoint, tram_llm
from tram.bench.timing import stats_ms


def add_latency_args(p: argparse.ArgumentParser) -> None:
    add_engine_flags(p)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters-warmup", type=int, default=1)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--output-json")
    add_prefill_flags(p)


def _one_batch(
    engine: Any, prompts: list[list[int]], output_len: int, tag: str
) -> tuple[float, list[float], list[float]]:
    """Seconds end to end, and the durations of prefill steps and of decode steps."""
    from tram.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=output_len, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    for ids in prompts:  # as LLM.generate would: a clear error, not a failed step, when one cannot fit
        engine.input_processor.check_prompt_length(len(ids), output_len)
    prefill, decode = [], []
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_processed_request(f"{tag}-{i}", None, ids, params)
    while engine.has_unfinished_requests():
        # A step taken while some prompt is not fully computed carries prompt tokens.
        bucket = decode if prompts_done(engine) else prefill
        t0 = time.perf_counter()
        engine.step()
        bucket.append(time.perf_counter() - t0)
    return time.perf_counter() - start, prefill, decode


def prompts_done(engine: Any) -> bool:
    """True once no request is waiting and none is mid-prompt."""
    sched = engine.engine_core.scheduler
    return not sched.waiting and all(r.num_computed_tokens >= r.num_prompt_tokens for r in sched.running)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    stats = stats_ms(values, [50, 90, 99])
    return {f"{k}_ms": stats[k] for k in ("mean", "p50", "p90", "p99")}


def run_latency(args: argparse.Namespace) -> dict:
    if args.prefill:
        return run_prefill(args)
    torch.set_num_threads(args.threads)
    llm = tram_llm(model_checkpoint(args), args, max(args.max_num_seqs, args.batch_size), enable_prefix_caching=False)
    engine = llm.llm_engine
    vocab = engine.engine_core.config.model_config.vocab_size
    e2e, prefill, decode = [], [], []
    for it in range(args.num_iters_warmup + args.num_iters):
        reqs = random_requests(
            args.batch_size, (args.input_len,) * 2, (args.output_len,) * 2, vocab, seed=args.seed + it
        )
        seconds, pre, dec = _one_batch(engine, [r.prompt_token_ids for r in reqs], args.output_len, f"it{it}")
        if it >= args.num_iters_warmup:
            e2e.append(seconds)
            prefill.extend(pre)
            decode.extend(dec)
    report = {
        "machine": machine_info(),
        "args": vars(args),
        "end_to_end": _stats(e2e),
        "prefill_step": _stats(prefill),
        "decode_step": _stats(decode),
        "num_prefill_steps": len(prefill),
        "num_decode_steps": len(decode),
        "output_tokens_per_s": args.batch_size * args.output_len / float(np.mean(e2e)),
    }
    print(machine_summary())
    print(f"batch {args.batch_size} x ({args.input_len} in, {args.output_len} out), {args.dtype}, model {args.model}")
    for key in ("end_to_end", "prefill_step", "decode_step"):
        s = report[key]
        if s:
            spread = f"p50 {s['p50_ms']:9.2f}   p90 {s['p90_ms']:9.2f}   p99 {s['p99_ms']:9.2f}"
            print(f"{key:<13} mean {s['mean_ms']:9.2f} ms   {spread}")
    print(f"output tokens/s {report['output_tokens_per_s']:.1f}")
    if args.output_json:
        write_json(args.output_json, report)
    return report
