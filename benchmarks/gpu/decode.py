"""Section `decode`: engine step time of decode-only steps at several batch sizes, against the
memory-bandwidth bound (weights + KV read once per step, over the measured copy bandwidth)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from tram.bench.latency import prompts_done
from tram.bench.timing import sync

from gpu.common import (  # isort: skip (this folder, on sys.path when gpu_bench.py runs)
    GOALS,
    Ctx,
    engine_summary,
    fixed_requests,
    log,
    make_llm,
    measure_copy_bandwidth,
    model_dir,
    parse_ints,
)
from gpu.profile import profile_steps  # isort: skip

# Tokens of max_model_len beyond the context and the measured steps (see run_decode).
DECODE_HEADROOM = 256


def weight_bytes_read(model: torch.nn.Module, batch: int, tied: bool) -> int:
    """Weight bytes one decode step must read: every matrix once, but of an untied embedding table
    only the `batch` rows that the lookup gathers."""
    total = 0
    for name, param in model.named_parameters():
        if "embed_tokens" in name and not tied:
            total += batch * param.shape[-1] * param.element_size()
        else:
            total += param.numel() * param.element_size()
    return total


def is_pure_decode(engine: Any, batch: int) -> bool:
    """Every request of the batch running with its whole prompt in the cache: the next step decodes
    `batch` tokens and nothing else."""
    return prompts_done(engine) and len(engine.engine_core.scheduler.running) == batch


def run_prefills(engine: Any, batch: int, max_steps: int) -> int:
    """Step until the next step is a pure decode step of `batch` tokens. Returns the steps taken."""
    for steps in range(max_steps):
        if is_pure_decode(engine, batch):
            return steps
        engine.step()
    raise RuntimeError(f"prefills of batch {batch} not done after {max_steps} steps")


def timed_decode_steps(ctx: Ctx, engine: Any, batch: int, kv_per_token: int) -> tuple[list[float], list[int]]:
    """Wall time (ms) and KV bytes read of each measured decode step, device synchronised around it."""
    args, sched = ctx.args, engine.engine_core.scheduler
    times: list[float] = []
    kv_bytes: list[int] = []
    for i in range(args.decode_warmup + args.decode_steps):
        if not is_pure_decode(engine, batch):  # a preemption or a finished request would skew the step
            raise RuntimeError(f"step {i} at batch {batch} is not a pure decode step")
        # A decode step writes one token per request and reads its whole context, that token included.
        context_tokens = sum(r.num_computed_tokens + 1 for r in sched.running)
        sync(ctx.device)
        start = time.perf_counter()
        engine.step()
        sync(ctx.device)
        if i >= args.decode_warmup:
            times.append((time.perf_counter() - start) * 1e3)
            kv_bytes.append(context_tokens * kv_per_token)
    return times, kv_bytes


def profiled(ctx: Ctx, engine: Any) -> dict[str, Any]:
    """profile_steps, or the reason it failed: a profiler that cannot start on a device (CUPTI) must
    not cost the decode timings measured before it."""
    try:
        return profile_steps(engine, ctx.device)
    except Exception as err:  # the timings stand without it
        log(f"decode: profiling failed: {type(err).__name__}: {err}")
        return {"error": f"{type(err).__name__}: {err}"}


def decode_row(ctx: Ctx, llm: Any, batch: int, bandwidth: float) -> dict[str, Any]:
    from tram import SamplingParams

    args, engine = ctx.args, llm.llm_engine
    runner = engine.engine_core.model_runner
    # max_tokens leaves room so that no request finishes inside the measured steps, also one whose
    # prompt was done early and that decoded while the others' prompts were still being prefilled.
    max_tokens = runner.model_config.max_model_len - args.context
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    ids = [f"decode-{batch}-{i}" for i in range(batch)]
    requests = fixed_requests(batch, args.context, 1, runner.vocab_size, args.seed + batch)
    for rid, req in zip(ids, requests):
        engine.add_request(rid, {"prompt_token_ids": req.prompt_token_ids}, params)
    try:
        prefill_steps = run_prefills(engine, batch, max_steps=batch * args.context + 100)
        kv_per_token = runner.bytes_per_block() // runner.block_size
        times, kv_bytes = timed_decode_steps(ctx, engine, batch, kv_per_token)
        profile = profiled(ctx, engine) if batch in parse_ints(args.profile_batches) else None
    finally:
        engine.abort_request(ids)
    tied = bool(getattr(runner.model_config.hf_config, "tie_word_embeddings", False))
    weights = weight_bytes_read(runner.model, batch, tied)
    step_ms = statistics.median(times)
    bound_ms = (weights + statistics.mean(kv_bytes)) / bandwidth * 1e3
    return {
        "batch": batch,
        "context": args.context,
        "prefill_steps": prefill_steps,
        "profile": profile,
        "measured_steps": len(times),
        "step_ms": step_ms,
        "step_ms_min": min(times),
        "step_ms_max": max(times),
        "output_tok_per_s": batch / (step_ms * 1e-3),
        "weight_bytes_read": weights,
        "kv_bytes_read": statistics.mean(kv_bytes),
        "bound_ms": bound_ms,
        "ratio": step_ms / bound_ms,
        "meets_goal": (
            step_ms / bound_ms <= GOALS["decode_ratio_max"] if batch >= GOALS["decode_goal_min_batch"] else None
        ),
    }


def run_decode(ctx: Ctx, results: dict[str, Any]) -> None:
    args = ctx.args
    batches = parse_ints(args.decode_batches)
    log(f"decode: copy bandwidth ({args.copy_mib} MiB)")
    results["copy"] = measure_copy_bandwidth(ctx.device, args.copy_mib)
    bandwidth = results["copy"]["bandwidth_GBps"] * 1e9
    results["rows"] = []
    # Room for the measured steps and for the tokens that the first requests decode while the last
    # ones are still prefilling (one per step of the batch's prefill).
    max_model_len = args.context + args.decode_warmup + args.decode_steps + DECODE_HEADROOM
    with model_dir(args) as path:
        log(f"decode: loading Tram ({args.preset}, dummy weights)")
        llm = make_llm(ctx, path, max(batches), max_model_len)
        results["engine"] = engine_summary(llm)
        for batch in batches:
            log(f"decode: batch {batch}, context {args.context}")
            results["rows"].append(decode_row(ctx, llm, batch, bandwidth))
            ctx.save()
        del llm
