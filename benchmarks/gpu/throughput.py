"""Section `throughput`: offline throughput of a fixed workload through `LLM.generate`, then through
transformers' continuous batching on the same prompts and model shape; plus the compute floor of the
workload at the measured matmul rate."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from tram.bench.datasets import BenchRequest
from tram.bench.hf_backends import HFContinuousBatching, load_hf_model
from tram.bench.timing import sync

from gpu.common import (  # isort: skip (this folder, on sys.path when gpu_bench.py runs)
    GOALS,
    Ctx,
    engine_summary,
    fixed_requests,
    free_memory,
    hf_config,
    log,
    make_llm,
    measure_matmul_rate,
    model_dir,
)


def workload_flops(cfg: Any, num: int, input_len: int, output_len: int) -> float:
    """Matmul and attention FLOPs of the workload (2 per multiply-add).

    The first output token comes from the prefill; each later one is a decode step over the growing
    context. Logits are computed only for the rows that sample, one per output token.
    """
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    head_dim = h // cfg.num_attention_heads
    kv_width = cfg.num_key_value_heads * head_dim
    per_layer = 2 * h * h + 2 * h * kv_width + 3 * h * cfg.intermediate_size  # q,o + k,v + gate,up,down
    linear = 2 * layers * per_layer * (input_len + output_len) + 2 * h * vocab * output_len
    pairs = input_len * (input_len + 1) // 2 + sum(input_len + k for k in range(1, output_len))
    attention = 4 * layers * cfg.num_attention_heads * head_dim * pairs  # QK^T and PV
    return float(num * (linear + attention))


def tram_throughput(ctx: Ctx, requests: list[BenchRequest]) -> dict[str, Any]:
    from tram import SamplingParams

    args = ctx.args
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    with model_dir(args) as path:
        log("throughput: loading Tram")
        setup_start = time.perf_counter()
        llm = make_llm(ctx, path, args.max_num_seqs, args.input_len + args.output_len)
        info = engine_summary(llm)
        # Warm-up on other prompts (no prefix-cache hits later): lazy init and kernel compiles stay out.
        warm = fixed_requests(min(8, len(requests)), args.input_len, 4, hf_config(args).vocab_size, args.seed + 999)
        llm.generate(
            [{"prompt_token_ids": r.prompt_token_ids} for r in warm],
            SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False),
            use_tqdm=False,
        )
        setup_s = time.perf_counter() - setup_start  # load, cache sizing, graph capture, warm-up
        log(f"throughput: Tram generate, {len(requests)} requests")
        inputs = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        sync(ctx.device)
        start = time.perf_counter()
        outputs = llm.generate(inputs, params, use_tqdm=False)
        sync(ctx.device)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        del outputs, llm
    return {
        "requests": len(requests),
        "output_tokens": tokens,
        "seconds": seconds,
        "output_tok_per_s": tokens / seconds,
        "total_tok_per_s": (tokens + len(requests) * args.input_len) / seconds,
        "setup_seconds": setup_s,
        "engine": info,
    }


def child_deadline(args: argparse.Namespace) -> float | None:
    """The perf_counter time by which the section's child must stop waiting for transformers, so
    that it saves its results before the parent kills it (None when not run as a child)."""
    if args.child_deadline is None:
        return None
    return time.perf_counter() + (args.child_deadline - time.time()) - 45


def hf_throughput(ctx: Ctx, requests: list[BenchRequest]) -> dict[str, Any]:
    """transformers' continuous batching as `generate_batch` runs it (same manager, warm-up and workload
    hints), its set-up (cache sizing, CUDA graph capture) timed apart, like Tram's LLM construction."""
    args = ctx.args
    log(f"throughput: building the transformers model ({args.hf_attn})")
    start = time.perf_counter()
    model = load_hf_model(hf_config(args), args.dtype, args.hf_attn, ctx.device)  # random weights, on the device
    load_s = time.perf_counter() - start
    cb = HFContinuousBatching(
        model,
        num_blocks=args.hf_num_blocks,
        max_batch_tokens=args.hf_max_batch_tokens,
        auto_switch_to_flash=False,
        size_for_workload=True,
    )
    try:
        log(f"throughput: transformers generate, {len(requests)} requests")
        with torch.no_grad():  # as generate_batch; the manager's thread sets its own mode
            run = cb.run(requests, timeout=args.hf_timeout, deadline=child_deadline(args))
    finally:
        cb.close()
        del model, cb
        free_memory(ctx.device)
    return {
        "requests": len(requests),
        "finished_requests": run.finished,
        "output_tokens": run.output_tokens,
        "seconds": run.seconds,
        "output_tok_per_s": run.output_tokens / run.seconds,
        "setup_seconds": run.setup_seconds,
        "timed_out": run.timed_out,
        "attn_implementation": run.attn_implementation,
        "use_cuda_graph": run.use_cuda_graph,
        "load_seconds": load_s,
    }


def memory_snapshot(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated_GiB": torch.cuda.memory_allocated(device) / 2**30,
        "free_GiB": free / 2**30,
        "total_GiB": total / 2**30,
    }


def run_throughput(ctx: Ctx, results: dict[str, Any]) -> None:
    args = ctx.args
    cfg = hf_config(args)
    requests = fixed_requests(args.num_requests, args.input_len, args.output_len, cfg.vocab_size, args.seed)
    results["workload"] = {
        "requests": args.num_requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    log(f"throughput: matmul rate (n={args.matmul_n})")
    matmul = results["matmul"] = measure_matmul_rate(ctx.device, ctx.dtype, args.matmul_n)
    flops = workload_flops(cfg, args.num_requests, args.input_len, args.output_len)
    floor_s = flops / (matmul["matmul_TFLOPs"] * 1e12)
    results["compute_floor"] = {
        "flops": flops,
        "seconds": floor_s,
        "max_output_tok_per_s": args.num_requests * args.output_len / floor_s,
    }
    results["tram"] = tram_throughput(ctx, requests)
    results["tram"]["meets_goal"] = results["tram"]["output_tok_per_s"] >= GOALS["throughput_output_tok_per_s"]
    ctx.save()
    free_memory(ctx.device)
    results["memory_before_hf"] = memory_snapshot(ctx.device)  # Tram's cache must be gone by now
    if args.skip_hf:
        results["hf"] = {"skipped": "--skip-hf"}
        return
    results["hf"] = hf_throughput(ctx, requests[: args.hf_num_requests or len(requests)])
    ratio = results["tram"]["output_tok_per_s"] / results["hf"]["output_tok_per_s"]
    results["ratio_tram_over_hf"] = ratio
    results["ratio_meets_goal"] = ratio >= GOALS["throughput_ratio_vs_hf"]
