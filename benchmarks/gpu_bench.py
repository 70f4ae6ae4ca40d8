"""GPU benchmark of Tram on a Llama-3-8B-shaped model with dummy weights, in one command.

    python3 benchmarks/gpu_bench.py [--out results.json] [--sections decode,kernels,throughput] [--smoke]

Sections (each runs in its own child process by default, so that a crash, a CUDA error or a timeout
in one loses nothing of the others; results are written to --out after every section):
  decode      engine step time of decode-only steps at batch 1/64/256 with 1,024 tokens of context,
              against the memory-bandwidth bound (weights + KV read once per step, over the measured
              device-to-device copy bandwidth).
  throughput  offline throughput, 1,000 requests x 1,024 random input / 128 output tokens, through
              `LLM.generate`, then transformers' continuous batching on the same prompts and model
              shape; plus the compute floor of the workload at the measured matmul rate.
  kernels     Tram's Triton kernels (write_kv_cache, paged_attention) against PyTorch SDPA on the
              equivalent dense problems, with a correctness check against a float32 reference.

--smoke runs everything on the CPU with tiny sizes (kernels under TRITON_INTERPRET=1) in well under a
minute; tests/test_gpu_bench_smoke.py uses it. `--smoke --device cuda` runs the same tiny sizes on
the GPU (compiled kernels, CUDA graphs, events): a one-minute check of every GPU code path before a
full run. Progress goes to stderr, the summary table to stdout.
"""
from __future__ import annotations

import os
import sys

# The Triton interpreter is chosen when @triton.jit runs, i.e. when the kernels module is imported,
# so the variable must be set before anything imports triton (children inherit it). Not for
# `--smoke --device cuda`: tiny sizes on the GPU, compiled kernels, a quick check of the GPU paths.
if "--smoke" in sys.argv and not {"cuda", "--device=cuda"} & set(sys.argv):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import contextlib
import datetime
import gc
import json
import platform
import signal
import statistics
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

SECTION_NAMES = ("decode", "kernels", "throughput")
GOALS = {"decode_ratio_max": 1.3, "decode_goal_min_batch": 64,
         "throughput_output_tok_per_s": 12_500, "throughput_ratio_vs_hf": 3.0}

LLAMA3_8B: dict[str, Any] = dict(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=False,
)
# Head dim 32 (not 16) so that the Triton kernels see a shape their tl.dot tiles accept.
TINY: dict[str, Any] = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, rope_theta=500000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=False,
)
PRESETS = {"llama3-8b": LLAMA3_8B, "tiny": TINY}
# Relative error of a bf16/fp16 attention against a float32 reference: rounding of the operands lands
# between 1e-3 and 1e-2 (METHOD.md); above this the kernel computes something else.
ATTN_REL_TOL = 2e-2

# --smoke replaces these defaults (flags given explicitly still win).
SMOKE_DEFAULTS: dict[str, Any] = dict(
    preset="tiny", device="cpu", decode_batches="1,4", context=48, decode_steps=3, decode_warmup=1,
    num_requests=6, input_len=24, output_len=6, hf_num_blocks=64, hf_max_batch_tokens=256,
    kernel_batches="1,2", kernel_context=64, kernel_splits="1,2", prefill_len=64, chunk_prefix=32,
    chunk_len=32, kernel_warmup=1, kernel_iters=2, copy_mib=32, matmul_n=256,
    section_timeouts="decode=120,kernels=120,throughput=120", hf_timeout=60,
)


def log(msg: str) -> None:
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Shared helpers: device, timing, ceilings
# ---------------------------------------------------------------------------------------------
@dataclass
class Ctx:
    """What a section needs: parsed flags, the device, and a way to save partial results."""

    args: argparse.Namespace
    device: torch.device
    dtype: torch.dtype
    save: Callable[[], None]


def resolve_bench_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "none"
    if name == "none" or (name == "cuda" and not torch.cuda.is_available()):
        raise RuntimeError("no CUDA device: run on a GPU machine, or pass --smoke (or --device cpu)")
    return torch.device(name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"type": "cpu", "name": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "total_memory_GiB": round(props.total_memory / 2**30, 2),
            "sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}


def median_ms(fn: Callable[[], Any], device: torch.device, warmup: int = 3, iters: int = 20) -> float:
    """Median time of fn in ms.

    On CUDA, triton's do_bench: CUDA events per call, L2 flushed before each call (so small problems
    are not timed out of cache), warm-up and repeats in milliseconds of device time. On the CPU
    (smoke mode only) a host clock: the numbers just have to exist.
    """
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure_copy_bandwidth(device: torch.device, mib: int) -> dict[str, float]:
    """Device-to-device copy of `mib` MiB; bytes read plus bytes written over the median time."""
    numel = mib * 2**20 // 2
    src = torch.randn(numel, dtype=torch.bfloat16, device=device)  # random, never zeros (METHOD.md)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device)
    assert torch.equal(dst, src), "copy check failed"
    moved = 2 * src.numel() * src.element_size()
    del src, dst
    free_memory(device)
    return {"copy_bytes": moved // 2, "copy_ms": ms, "bandwidth_GBps": moved / (ms * 1e-3) / 1e9}


def measure_matmul_rate(device: torch.device, dtype: torch.dtype, n: int) -> dict[str, float]:
    """Square matmul through torch (cuBLAS on CUDA): the practical ceiling for the model's GEMMs."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    ms = median_ms(lambda: a @ b, device)
    del a, b
    free_memory(device)
    return {"matmul_n": n, "matmul_ms": ms, "matmul_TFLOPs": 2 * n**3 / (ms * 1e-3) / 1e12}


def random_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    # Ids 0-2 are special in Llama-style vocabularies; stay above them.
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (num, length), generator=gen).tolist()


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------------------------------
# Model preset and Tram engine
# ---------------------------------------------------------------------------------------------
def hf_config(args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**PRESETS[args.preset], dtype=args.dtype, architectures=["LlamaForCausalLM"])


@contextlib.contextmanager
def model_dir(args: argparse.Namespace) -> Iterator[str]:
    """A folder with only config.json: Tram loads dummy weights and skips the tokenizer."""
    with tempfile.TemporaryDirectory(prefix="tram-bench-") as path:
        hf_config(args).save_pretrained(path)
        yield path


def make_llm(ctx: Ctx, path: str, max_num_seqs: int, max_model_len: int) -> Any:
    from tram import LLM

    args = ctx.args
    kwargs: dict[str, Any] = dict(
        load_format="dummy", dtype=args.dtype, skip_tokenizer_init=True, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, block_size=args.block_size, seed=args.seed, device=ctx.device.type,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    if args.attention_backend:
        kwargs["attention_backend"] = args.attention_backend
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.enforce_eager:
        kwargs["enforce_eager"] = True
    return LLM(path, **kwargs)


def engine_summary(llm: Any) -> dict[str, Any]:
    cfg = llm.llm_engine.engine_core.config
    graphs = getattr(llm.llm_engine.engine_core.model_runner, "graph_runner", None)
    return {"attention_backend": cfg.model_config.attention_backend,
            "enforce_eager": getattr(cfg.model_config, "enforce_eager", None),
            "num_kv_blocks": cfg.cache_config.num_blocks,
            "block_size": cfg.cache_config.block_size, "max_num_seqs": cfg.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "decode_graph_sizes": list(graphs.sizes) if graphs is not None else None}


# ---------------------------------------------------------------------------------------------
# Section 1: decode step time against the bandwidth bound
# ---------------------------------------------------------------------------------------------
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


def run_prefills(engine: Any, batch: int, max_steps: int) -> int:
    """Step until every request of the batch is running with its whole prompt in the cache, so that
    the next step is a pure decode step of `batch` tokens. Returns the number of steps taken."""
    sched = engine.engine_core.scheduler
    for steps in range(max_steps):
        if is_pure_decode(sched, batch):
            return steps
        engine.step()
    raise RuntimeError(f"prefills of batch {batch} not done after {max_steps} steps")


def is_pure_decode(sched: Any, batch: int) -> bool:
    return (not sched.waiting and len(sched.running) == batch
            and all(r.num_computed_tokens >= r.num_prompt_tokens for r in sched.running))


def timed_decode_steps(ctx: Ctx, engine: Any, batch: int, kv_per_token: int) -> tuple[list[float], list[int]]:
    """Wall time (ms) and KV bytes read of each measured decode step, device synchronised around it."""
    args, sched = ctx.args, engine.engine_core.scheduler
    times: list[float] = []
    kv_bytes: list[int] = []
    for i in range(args.decode_warmup + args.decode_steps):
        if not is_pure_decode(sched, batch):  # a preemption or a finished request would skew the step
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


def decode_row(ctx: Ctx, llm: Any, batch: int, bandwidth: float) -> dict[str, Any]:
    from tram import SamplingParams

    args, engine = ctx.args, llm.llm_engine
    runner = engine.engine_core.model_runner
    num_steps = args.decode_warmup + args.decode_steps
    # max_tokens leaves room so that no request finishes inside the measured steps.
    params = SamplingParams(temperature=0.0, max_tokens=num_steps + 2, ignore_eos=True, detokenize=False)
    ids = [f"decode-{batch}-{i}" for i in range(batch)]
    prompts = random_prompts(batch, args.context, runner.vocab_size, args.seed + batch)
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    try:
        prefill_steps = run_prefills(engine, batch, max_steps=batch * args.context + 100)
        kv_per_token = runner.bytes_per_block() // runner.block_size
        times, kv_bytes = timed_decode_steps(ctx, engine, batch, kv_per_token)
    finally:
        engine.abort_request(ids)
    tied = bool(getattr(runner.model_config.hf_config, "tie_word_embeddings", False))
    weights = weight_bytes_read(runner.model, batch, tied)
    step_ms = statistics.median(times)
    bound_ms = (weights + statistics.mean(kv_bytes)) / bandwidth * 1e3
    return {
        "batch": batch, "context": args.context, "prefill_steps": prefill_steps, "measured_steps": len(times),
        "step_ms": step_ms, "step_ms_min": min(times), "step_ms_max": max(times),
        "output_tok_per_s": batch / (step_ms * 1e-3), "weight_bytes_read": weights,
        "kv_bytes_read": statistics.mean(kv_bytes), "bound_ms": bound_ms, "ratio": step_ms / bound_ms,
        "meets_goal": (step_ms / bound_ms <= GOALS["decode_ratio_max"]
                       if batch >= GOALS["decode_goal_min_batch"] else None),
    }


def run_decode(ctx: Ctx, results: dict[str, Any]) -> None:
    args = ctx.args
    batches = parse_ints(args.decode_batches)
    log(f"decode: copy bandwidth ({args.copy_mib} MiB)")
    results["copy"] = measure_copy_bandwidth(ctx.device, args.copy_mib)
    bandwidth = results["copy"]["bandwidth_GBps"] * 1e9
    results["rows"] = []
    max_model_len = args.context + args.decode_warmup + args.decode_steps + 8
    with model_dir(args) as path:
        log(f"decode: loading Tram ({args.preset}, dummy weights)")
        llm = make_llm(ctx, path, max(batches), max_model_len)
        results["engine"] = engine_summary(llm)
        for batch in batches:
            log(f"decode: batch {batch}, context {args.context}")
            results["rows"].append(decode_row(ctx, llm, batch, bandwidth))
            ctx.save()
        del llm


# ---------------------------------------------------------------------------------------------
# Section 2: offline throughput, Tram against transformers' continuous batching
# ---------------------------------------------------------------------------------------------
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


def tram_throughput(ctx: Ctx, prompts: list[list[int]]) -> dict[str, Any]:
    from tram import SamplingParams

    args = ctx.args
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    with model_dir(args) as path:
        log("throughput: loading Tram")
        setup_start = time.perf_counter()
        llm = make_llm(ctx, path, args.max_num_seqs, args.input_len + args.output_len)
        info = engine_summary(llm)
        # Warm-up on other prompts (no prefix-cache hits later): lazy init and kernel compiles stay out.
        warm = random_prompts(min(8, len(prompts)), args.input_len, hf_config(args).vocab_size, args.seed + 999)
        llm.generate([{"prompt_token_ids": p} for p in warm],
                     SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False), use_tqdm=False)
        setup_s = time.perf_counter() - setup_start  # load, cache sizing, graph capture, warm-up
        log(f"throughput: Tram generate, {len(prompts)} requests")
        inputs = [{"prompt_token_ids": p} for p in prompts]
        sync(ctx.device)
        start = time.perf_counter()
        outputs = llm.generate(inputs, params, use_tqdm=False)
        sync(ctx.device)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        del outputs, llm
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": seconds,
            "output_tok_per_s": tokens / seconds,
            "total_tok_per_s": (tokens + len(prompts) * args.input_len) / seconds, "setup_seconds": setup_s,
            "engine": info}


def collect_hf(manager: Any, num: int, deadline: float) -> tuple[int, int, bool]:
    """(finished requests, their output tokens, timed out) from the manager's result queue."""
    finished = tokens = 0
    while finished < num:
        if time.perf_counter() > deadline:
            return finished, tokens, True
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' generation thread stopped before all requests finished")
            continue
        if result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"transformers request {result.request_id} failed: {result.error}")
            finished += 1
            tokens += len(result.generated_tokens)
    return finished, tokens, False


def run_hf_manager(ctx: Ctx, model: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """What generate_batch does (same manager, same warm-up, same workload hints), with the set-up
    (cache sizing, CUDA graph capture) timed apart from the generation, like Tram's LLM construction."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    args = ctx.args
    # eos -1: no token ends a request, the counterpart of Tram's ignore_eos.
    gen = GenerationConfig(max_new_tokens=args.output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(auto_switch_to_flash=False, num_blocks=args.hf_num_blocks,
                                  max_batch_tokens=args.hf_max_batch_tokens)
    hints = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=args.output_len,
                          num_requests=len(prompts))
    start = time.perf_counter()
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb, workload_hints=hints)
    attn = model.config._attn_implementation  # after the manager's switch, if it made one
    manager.warmup()
    graphs = str(getattr(manager.continuous_batching_config, "use_cuda_graph", None))
    manager.start()
    setup_s = time.perf_counter() - start
    clean = False
    try:
        log(f"throughput: transformers generate ({attn}), {len(prompts)} requests")
        sync(ctx.device)
        start = time.perf_counter()
        manager.add_requests(inputs=prompts, max_new_tokens=args.output_len)
        finished, tokens, timed_out = collect_hf(manager, len(prompts), hf_deadline(args, start))
        sync(ctx.device)
        seconds = time.perf_counter() - start
        clean = not timed_out
    finally:
        manager.stop(block=True, timeout=60, hard_stop=not clean)
        manager.destroy()
    return {"requests": len(prompts), "finished_requests": finished, "output_tokens": tokens,
            "seconds": seconds, "output_tok_per_s": tokens / seconds, "setup_seconds": setup_s,
            "timed_out": timed_out, "attn_implementation": attn, "use_cuda_graph": graphs}


def hf_deadline(args: argparse.Namespace, start: float) -> float:
    """perf_counter time at which to stop waiting for transformers: --hf-timeout after the start, and
    early enough that the section's child saves its results before the parent kills it."""
    deadline = start + args.hf_timeout
    if args.child_deadline is not None:
        deadline = min(deadline, time.perf_counter() + (args.child_deadline - time.time()) - 45)
    return deadline


def hf_throughput(ctx: Ctx, prompts: list[list[int]]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    log(f"throughput: building the transformers model ({ctx.args.hf_attn})")
    start = time.perf_counter()
    # Built under the device context so that the random init runs on the GPU, not the host.
    with torch.device(ctx.device):
        model = AutoModelForCausalLM.from_config(hf_config(ctx.args), dtype=ctx.dtype,
                                                 attn_implementation=ctx.args.hf_attn)
    model = model.to(ctx.device).eval()
    load_s = time.perf_counter() - start
    try:
        with torch.no_grad():  # as generate_batch; the manager's thread sets its own mode
            return run_hf_manager(ctx, model, prompts) | {"load_seconds": load_s}
    finally:
        del model
        free_memory(ctx.device)


def memory_snapshot(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated_GiB": torch.cuda.memory_allocated(device) / 2**30, "free_GiB": free / 2**30,
            "total_GiB": total / 2**30}


def run_throughput(ctx: Ctx, results: dict[str, Any]) -> None:
    args = ctx.args
    cfg = hf_config(args)
    prompts = random_prompts(args.num_requests, args.input_len, cfg.vocab_size, args.seed)
    results["workload"] = {"requests": args.num_requests, "input_len": args.input_len,
                           "output_len": args.output_len, "temperature": 0.0, "ignore_eos": True}
    log(f"throughput: matmul rate (n={args.matmul_n})")
    matmul = results["matmul"] = measure_matmul_rate(ctx.device, ctx.dtype, args.matmul_n)
    flops = workload_flops(cfg, args.num_requests, args.input_len, args.output_len)
    floor_s = flops / (matmul["matmul_TFLOPs"] * 1e12)
    results["compute_floor"] = {"flops": flops, "seconds": floor_s,
                                "max_output_tok_per_s": args.num_requests * args.output_len / floor_s}
    results["tram"] = tram_throughput(ctx, prompts)
    results["tram"]["meets_goal"] = results["tram"]["output_tok_per_s"] >= GOALS["throughput_output_tok_per_s"]
    ctx.save()
    free_memory(ctx.device)
    results["memory_before_hf"] = memory_snapshot(ctx.device)  # Tram's cache must be gone by now
    if args.skip_hf:
        results["hf"] = {"skipped": "--skip-hf"}
        return
    results["hf"] = hf_throughput(ctx, prompts[: args.hf_num_requests or len(prompts)])
    ratio = results["tram"]["output_tok_per_s"] / results["hf"]["output_tok_per_s"]
    results["ratio_tram_over_hf"] = ratio
    results["ratio_meets_goal"] = ratio >= GOALS["throughput_ratio_vs_hf"]


# ---------------------------------------------------------------------------------------------
# Section 3: Triton kernels against PyTorch SDPA
# ---------------------------------------------------------------------------------------------
@dataclass
class AttnShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    device: torch.device

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


@dataclass
class PagedProblem:
    """One batch of equal requests, in the paged layout Tram's kernels read and as dense SDPA inputs."""

    query: torch.Tensor  # [B * q_len, Hq, D]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, Hkv, D]
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, blocks per sequence] int32
    dense_q: torch.Tensor  # [B, Hq, q_len, D]
    dense_k: torch.Tensor  # [B, Hkv, context, D]
    dense_v: torch.Tensor  # [B, Hkv, context, D]
    mask: torch.Tensor | None  # [q_len, context] bool, True = attend (a chunk after a cached prefix)
    causal: bool  # a whole prompt: plain causal

    @property
    def batch(self) -> int:
        return self.dense_q.shape[0]

    @property
    def query_len(self) -> int:
        return self.dense_q.shape[2]


def build_problem(s: AttnShape, batch: int, query_len: int, context: int) -> PagedProblem:
    blocks = -(-context // s.block_size)
    num_blocks = batch * blocks + 1
    kw = dict(dtype=s.dtype, device=s.device)
    # Shuffled blocks, as after real allocation and frees; block 0 is never used, like the engine's padding.
    order = torch.randperm(num_blocks - 1) + 1
    block_tables = order[: batch * blocks].view(batch, blocks).to(torch.int32).to(s.device)
    k = torch.randn(batch, context, s.num_kv_heads, s.head_dim, **kw)
    v = torch.randn(batch, context, s.num_kv_heads, s.head_dim, **kw)
    # Random everywhere else too: a kernel reading past seq_len or the wrong block shows in the error.
    kv_cache = torch.randn(2, num_blocks, s.block_size, s.num_kv_heads, s.head_dim, **kw)
    pos = torch.arange(context, device=s.device)
    slots = (block_tables.long()[:, pos // s.block_size] * s.block_size + pos % s.block_size).flatten()
    kv_cache[0].view(-1, s.num_kv_heads, s.head_dim)[slots] = k.flatten(0, 1)
    kv_cache[1].view(-1, s.num_kv_heads, s.head_dim)[slots] = v.flatten(0, 1)
    query = torch.randn(batch * query_len, s.num_heads, s.head_dim, **kw)
    mask = None
    if 1 < query_len < context:  # query token i sits at position context - query_len + i
        q_pos = torch.arange(context - query_len, context, device=s.device)
        mask = pos[None, :] <= q_pos[:, None]
    return PagedProblem(
        query=query, kv_cache=kv_cache,
        query_start_loc=(torch.arange(batch + 1, device=s.device) * query_len).to(torch.int32),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=s.device), block_tables=block_tables,
        dense_q=query.view(batch, query_len, s.num_heads, s.head_dim).transpose(1, 2).contiguous(),
        dense_k=k.transpose(1, 2).contiguous(), dense_v=v.transpose(1, 2).contiguous(),
        mask=mask, causal=query_len > 1 and mask is None,
    )


def sdpa_variants(p: PagedProblem, scale: float) -> dict[str, Callable[[], torch.Tensor]]:
    """SDPA with enable_gqa, and with K/V heads repeated beforehand: PyTorch's fused backends differ in
    what they accept (a boolean mask with GQA can fall back to the math path), so the faster of the
    two is the fair baseline."""
    rep = p.dense_q.shape[1] // p.dense_k.shape[1]
    k_rep, v_rep = p.dense_k.repeat_interleave(rep, dim=1), p.dense_v.repeat_interleave(rep, dim=1)
    q, k, v, mask, causal = p.dense_q, p.dense_k, p.dense_v, p.mask, p.causal
    return {
        "sdpa_gqa": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True),
        "sdpa_repeat_kv": lambda: F.scaled_dot_product_attention(
            q, k_rep, v_rep, attn_mask=mask, is_causal=causal, scale=scale),
    }


def reference_error(p: PagedProblem, out: torch.Tensor, scale: float, max_reqs: int = 8) -> float:
    """‖out − ref‖ / ‖ref‖ against float32 SDPA on upcast inputs, over the first few requests (enough
    to catch wrong indexing; all 256 in float32 would cost gigabytes)."""
    n = min(p.batch, max_reqs)
    q, k, v = (t[:n].float() for t in (p.dense_q, p.dense_k, p.dense_v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=p.mask, is_causal=p.causal, scale=scale, enable_gqa=True)
    got = out[: n * p.query_len].float().view(n, p.query_len, q.shape[1], q.shape[3]).transpose(1, 2)
    return float((got - ref).norm() / ref.norm())


def paged_call(tk: Any, p: PagedProblem, out: torch.Tensor, scale: float, splits: int) -> Callable[[], Any]:
    return lambda: tk.paged_attention(
        p.query, p.kv_cache, out, p.query_start_loc, p.seq_lens, p.block_tables, scale,
        num_reqs=p.batch, max_query_len=p.query_len, sliding_window=None, num_splits=splits)


def attention_rows(ctx: Ctx, tk: Any, s: AttnShape, case: str, batch: int, query_len: int, context: int,
                   splits: list[int], bandwidth: float) -> list[dict[str, Any]]:
    """One row per num_splits: Tram's paged_attention against the best SDPA variant on one problem."""
    args = ctx.args
    p = build_problem(s, batch, query_len, context)
    sdpa = {name: median_ms(fn, s.device, args.kernel_warmup, args.kernel_iters)
            for name, fn in sdpa_variants(p, s.scale).items()}
    best = min(sdpa, key=sdpa.__getitem__)
    elem = torch.empty((), dtype=s.dtype).element_size()
    kv_bytes = batch * context * 2 * s.num_kv_heads * s.head_dim * elem
    q_start = context - query_len
    pairs = batch * sum(q_start + i + 1 for i in range(query_len))  # (query, key) pairs attended
    rows = []
    for num_splits in splits:
        out = torch.full_like(p.query, float("nan"))  # poisoned: an unwritten element fails the check
        call = paged_call(tk, p, out, s.scale, num_splits)
        call()
        sync(s.device)
        all_written = bool(torch.isfinite(out).all())
        err = reference_error(p, out, s.scale)
        ms = median_ms(call, s.device, args.kernel_warmup, args.kernel_iters)
        rows.append({
            "case": case, "batch": batch, "query_len": query_len, "context": context, "num_splits": num_splits,
            "tram_ms": ms, "sdpa_ms": sdpa[best], "sdpa_best": best, "sdpa_variants_ms": sdpa,
            "speedup_vs_sdpa": sdpa[best] / ms, "rel_err": err, "all_written": all_written,
            "correct": all_written and err < ATTN_REL_TOL,
            "kv_bytes": kv_bytes, "tram_GBps": kv_bytes / (ms * 1e-3) / 1e9,
            "fraction_of_copy_bw": kv_bytes / (ms * 1e-3) / bandwidth,
            "tram_TFLOPs": 4 * pairs * s.num_heads * s.head_dim / (ms * 1e-3) / 1e12,
        })
    return rows


def write_kv_row(ctx: Ctx, tk: Any, s: AttnShape, num_tokens: int) -> dict[str, Any]:
    """write_kv_cache of num_tokens tokens to scattered slots, against torch's index_copy_."""
    args = ctx.args
    num_blocks = 2 * -(-num_tokens // s.block_size) + 1
    kw = dict(dtype=s.dtype, device=s.device)
    kv_cache = torch.randn(2, num_blocks, s.block_size, s.num_kv_heads, s.head_dim, **kw)
    slots = torch.randperm(num_blocks * s.block_size)[:num_tokens].to(s.device)  # int64, as the engine's
    key = torch.randn(num_tokens, s.num_kv_heads, s.head_dim, **kw)
    value = torch.randn(num_tokens, s.num_kv_heads, s.head_dim, **kw)
    flat_k = kv_cache[0].view(-1, s.num_kv_heads, s.head_dim)  # views: writes land in kv_cache
    flat_v = kv_cache[1].view(-1, s.num_kv_heads, s.head_dim)

    def tram() -> None:
        tk.write_kv_cache(key, value, kv_cache, slots)

    def torch_copy() -> None:
        flat_k.index_copy_(0, slots, key)
        flat_v.index_copy_(0, slots, value)

    tram()
    sync(s.device)
    correct = bool(torch.equal(flat_k[slots], key) and torch.equal(flat_v[slots], value))
    tram_ms = median_ms(tram, s.device, args.kernel_warmup, args.kernel_iters)
    torch_ms = median_ms(torch_copy, s.device, args.kernel_warmup, args.kernel_iters)
    moved = 2 * 2 * key.numel() * key.element_size()  # K and V, each read once and written once
    return {"num_tokens": num_tokens, "tram_ms": tram_ms, "torch_index_copy_ms": torch_ms,
            "speedup_vs_torch": torch_ms / tram_ms, "correct": correct, "bytes_moved": moved,
            "tram_GBps": moved / (tram_ms * 1e-3) / 1e9}


def attn_shape(ctx: Ctx) -> AttnShape:
    cfg = PRESETS[ctx.args.preset]
    return AttnShape(cfg["num_attention_heads"], cfg["num_key_value_heads"],
                     cfg["hidden_size"] // cfg["num_attention_heads"], ctx.args.block_size, ctx.dtype, ctx.device)


def run_kernels(ctx: Ctx, results: dict[str, Any]) -> None:
    from tram.model.attention import triton_kernels as tk  # an ImportError is this section's error

    args, s = ctx.args, attn_shape(ctx)
    batches = parse_ints(args.kernel_batches)
    results["shape"] = {"num_heads": s.num_heads, "num_kv_heads": s.num_kv_heads, "head_dim": s.head_dim,
                        "block_size": s.block_size, "dtype": str(s.dtype).removeprefix("torch."),
                        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0")}
    results["copy"] = measure_copy_bandwidth(s.device, args.copy_mib)
    bandwidth = results["copy"]["bandwidth_GBps"] * 1e9
    results["write_kv_cache"], results["decode"], results["prefill"] = [], [], []
    for num_tokens in (max(batches), args.prefill_len):
        log(f"kernels: write_kv_cache, {num_tokens} tokens")
        results["write_kv_cache"].append(write_kv_row(ctx, tk, s, num_tokens))
        ctx.save()
    for batch in batches:
        log(f"kernels: decode, batch {batch}, context {args.kernel_context}")
        results["decode"] += attention_rows(ctx, tk, s, "decode", batch, 1, args.kernel_context,
                                            parse_ints(args.kernel_splits), bandwidth)
        ctx.save()
    prefills = [("prefill", args.prefill_len, args.prefill_len),
                ("chunk_after_prefix", args.chunk_len, args.chunk_prefix + args.chunk_len)]
    for case, query_len, context in prefills:
        log(f"kernels: {case}, {query_len} query tokens, context {context}")
        results["prefill"] += attention_rows(ctx, tk, s, case, 1, query_len, context, [1], bandwidth)
        ctx.save()
    rows = results["write_kv_cache"] + results["decode"] + results["prefill"]
    results["all_correct"] = all(r["correct"] for r in rows)


# ---------------------------------------------------------------------------------------------
# Running sections (each in a child process by default) and the report
# ---------------------------------------------------------------------------------------------
SECTIONS: dict[str, Callable[[Ctx, dict[str, Any]], None]] = {
    "decode": run_decode, "kernels": run_kernels, "throughput": run_throughput,
}


def write_json(path: Path, data: dict[str, Any]) -> None:
    # Write then rename: a reader (or a kill mid-write) never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def run_section(name: str, args: argparse.Namespace, save_entry: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run one section in this process; an exception becomes the entry's error, partial results stay."""
    entry: dict[str, Any] = {"status": "running", "results": {}}
    device: torch.device | None = None
    start = time.perf_counter()
    try:
        device = resolve_bench_device(args.device)
        entry["device"] = device_info(device)
        torch.manual_seed(args.seed)
        ctx = Ctx(args, device, getattr(torch, args.dtype), save=lambda: save_entry(entry))
        SECTIONS[name](ctx, entry["results"])
        entry["status"] = "ok"
    except Exception as err:  # report and carry on with the other sections
        entry["status"] = "error"
        entry["error"] = f"{type(err).__name__}: {err}"
        entry["traceback"] = traceback.format_exc()
        log(f"{name}: FAILED\n{entry['traceback']}")
    entry["seconds"] = time.perf_counter() - start
    if device is not None:
        with contextlib.suppress(Exception):  # after a CUDA error even this can fail
            free_memory(device)
    save_entry(entry)
    return entry


def run_section_in_child(name: str, timeout: float) -> dict[str, Any]:
    """The same script in a child process: a CUDA error, a crash or a timeout there loses only this
    section (its results saved so far are kept), and each section starts with a clean GPU."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        path = Path(tmp) / f"{name}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--child-section", name,
               "--child-out", str(path), "--child-deadline", str(time.time() + timeout)]
        proc = subprocess.Popen(cmd, start_new_session=True)  # own group: a timeout kills its helpers too
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        entry = json.loads(path.read_text()) if path.exists() else {"status": "error", "results": {}}
    entry["wall_seconds"] = time.perf_counter() - start  # with the child's imports and start-up
    entry.setdefault("seconds", entry["wall_seconds"])  # a killed child never wrote its own
    if code is None:
        entry.update(status="error", error=f"timed out after {timeout:.0f} s (results saved so far kept)")
    elif code != 0 and entry.get("status") != "error":
        entry.update(status="error", error=f"child process exited with code {code}")
    return entry


def git_revision() -> dict[str, Any]:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    with contextlib.suppress(Exception):
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    return {}


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__,
                                  "cuda": torch.version.cuda}
    for pkg in ("triton", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def new_report(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "argv": sys.argv[1:], "args": vars(args), "smoke": args.smoke, "versions": versions(),
                 "platform": platform.platform(), "git": git_revision(), "device": None},
        "goals": GOALS,
        "sections": {},
    }


# ---------------------------------------------------------------------------------------------
# Summary tables (stdout)
# ---------------------------------------------------------------------------------------------
def fmt_goal(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "MISS")


def print_decode(res: dict[str, Any]) -> None:
    copy, engine = res.get("copy", {}), res.get("engine", {})
    print(f"copy bandwidth {copy.get('bandwidth_GBps', float('nan')):.0f} GB/s; "
          f"attention backend {engine.get('attention_backend')}")
    print(f"{'batch':>5} {'context':>7} {'step ms':>8} {'bound ms':>8} {'ratio':>6} {'tok/s':>9} {'goal<=1.3':>9}")
    for r in res.get("rows", []):
        print(f"{r['batch']:>5} {r['context']:>7} {r['step_ms']:>8.2f} {r['bound_ms']:>8.2f} {r['ratio']:>6.2f} "
              f"{r['output_tok_per_s']:>9.0f} {fmt_goal(r['meets_goal']):>9}")


def print_throughput(res: dict[str, Any]) -> None:
    w = res.get("workload", {})
    print(f"{w.get('requests')} requests x {w.get('input_len')} in / {w.get('output_len')} out")
    print(f"{'engine':<13} {'requests':>8} {'out tok/s':>10} {'total tok/s':>11} {'seconds':>8} {'setup s':>8}")
    for name in ("tram", "hf"):
        r = res.get(name)
        if not r or "output_tok_per_s" not in r:
            print(f"{name:<13} {r.get('skipped', '-') if r else '-'}")
            continue
        total = r.get("total_tok_per_s", (r["output_tokens"] + r["requests"] * w.get("input_len", 0)) / r["seconds"])
        note = " (timed out: finished requests only)" if r.get("timed_out") else ""
        print(f"{name:<13} {r['requests']:>8} {r['output_tok_per_s']:>10.0f} {total:>11.0f} {r['seconds']:>8.1f} "
              f"{r.get('setup_seconds', float('nan')):>8.1f}{note}")
    if "ratio_tram_over_hf" in res:
        print(f"Tram / transformers: {res['ratio_tram_over_hf']:.2f}x "
              f"({fmt_goal(res['ratio_meets_goal'])}, goal >= 3x)")
    if "tram" in res:
        print(f"Tram output tok/s goal >= 12,500: {fmt_goal(res['tram'].get('meets_goal'))}")
    floor, mm = res.get("compute_floor"), res.get("matmul", {})
    if floor:
        print(f"compute floor {floor['seconds']:.1f} s at {mm.get('matmul_TFLOPs', 0):.0f} TFLOP/s (matmul "
              f"n={mm.get('matmul_n')}): at most {floor['max_output_tok_per_s']:.0f} output tok/s")


def print_kernels(res: dict[str, Any]) -> None:
    print(f"shape {res.get('shape')}; all outputs correct: {res.get('all_correct')}")
    print(f"{'write_kv_cache tokens':>21} {'tram ms':>8} {'torch ms':>9} {'speedup':>8} {'correct':>8}")
    for r in res.get("write_kv_cache", []):
        print(f"{r['num_tokens']:>21} {r['tram_ms']:>8.4f} {r['torch_index_copy_ms']:>9.4f} "
              f"{r['speedup_vs_torch']:>8.2f} {str(r['correct']):>8}")
    print(f"{'case':<18} {'B':>4} {'q':>5} {'ctx':>5} {'split':>5} {'tram ms':>8} {'sdpa ms':>8} {'sdpa':>14} "
          f"{'speedup':>7} {'rel err':>8} {'GB/s':>6} {'%copy':>6} {'check':>5}")
    for r in res.get("decode", []) + res.get("prefill", []):
        print(f"{r['case']:<18} {r['batch']:>4} {r['query_len']:>5} {r['context']:>5} {r['num_splits']:>5} "
              f"{r['tram_ms']:>8.4f} {r['sdpa_ms']:>8.4f} {r['sdpa_best']:>14} {r['speedup_vs_sdpa']:>7.2f} "
              f"{r['rel_err']:>8.1e} {r['tram_GBps']:>6.0f} {100 * r['fraction_of_copy_bw']:>5.0f}% "
              f"{'ok' if r['correct'] else 'WRONG':>5}")


PRINTERS = {"decode": print_decode, "throughput": print_throughput, "kernels": print_kernels}


def print_report(report: dict[str, Any]) -> None:
    meta = report["meta"]
    dev = meta.get("device") or {}
    print(f"\n# gpu_bench {meta['date']} on {dev.get('name')} | "
          + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    for name, entry in report["sections"].items():
        print(f"\n== {name}: {entry['status']} ({entry.get('seconds', 0):.0f} s) ==")
        with contextlib.suppress(Exception):  # a partial result may lack fields; show what there is
            PRINTERS[name](entry.get("results", {}))
        if entry["status"] != "ok":
            print(f"ERROR: {entry.get('error')}")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def default_out() -> Path:
    # On the lent device machine $OUT is the folder whose files come back.
    return Path(os.environ["OUT"]) / "gpu_bench.json" if os.environ.get("OUT") else Path("gpu_bench_results.json")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--out", type=Path, default=None, help="JSON report (default $OUT/gpu_bench.json or ./gpu_bench_results.json)")
    a("--sections", default=",".join(SECTION_NAMES), help="comma-separated subset of " + ",".join(SECTION_NAMES))
    a("--smoke", action="store_true", help="tiny sizes on the CPU, kernels under TRITON_INTERPRET=1")
    a("--device", default="auto", choices=["auto", "cuda", "cpu"])
    a("--preset", default="llama3-8b", choices=sorted(PRESETS))
    a("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    a("--seed", type=int, default=0)
    a("--block-size", type=int, default=16)
    a("--attention-backend", default=None, help="Tram attention backend (default: the engine's)")
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--max-num-seqs", type=int, default=256, help="throughput section's Tram max_num_seqs")
    a("--max-num-batched-tokens", type=int, default=None)
    a("--enforce-eager", action="store_true", help="Tram without CUDA graphs")
    g = p.add_argument_group("decode")
    g.add_argument("--decode-batches", default="1,64,256")
    g.add_argument("--context", type=int, default=1024, help="prompt tokens per sequence before decoding")
    g.add_argument("--decode-steps", type=int, default=20, help="measured decode steps per batch (median)")
    g.add_argument("--decode-warmup", type=int, default=3)
    g.add_argument("--copy-mib", type=int, default=2048, help="size of the bandwidth-measuring copy")
    g = p.add_argument_group("throughput")
    g.add_argument("--num-requests", type=int, default=1000)
    g.add_argument("--input-len", type=int, default=1024)
    g.add_argument("--output-len", type=int, default=128)
    g.add_argument("--hf-num-requests", type=int, default=None, help="default: --num-requests")
    g.add_argument("--hf-attn", default="sdpa", help="transformers attn_implementation ('paged|sdpa' is "
                   "deprecated in transformers 5 and means the same under continuous batching)")
    g.add_argument("--hf-timeout", type=float, default=150.0, help="seconds; then finished requests only count")
    g.add_argument("--hf-num-blocks", type=int, default=None)
    g.add_argument("--hf-max-batch-tokens", type=int, default=None)
    g.add_argument("--skip-hf", action="store_true")
    g.add_argument("--matmul-n", type=int, default=8192)
    g = p.add_argument_group("kernels")
    g.add_argument("--kernel-batches", default="1,64,256")
    g.add_argument("--kernel-context", type=int, default=1024)
    g.add_argument("--kernel-splits", default="1,8", help="num_splits values timed at every decode batch")
    g.add_argument("--prefill-len", type=int, default=1024)
    g.add_argument("--chunk-prefix", type=int, default=512)
    g.add_argument("--chunk-len", type=int, default=512)
    g.add_argument("--kernel-warmup", type=int, default=3, help="CPU timing only (CUDA uses do_bench)")
    g.add_argument("--kernel-iters", type=int, default=20, help="CPU timing only (CUDA uses do_bench)")
    g = p.add_argument_group("running")
    g.add_argument("--section-timeouts", default="decode=150,kernels=120,throughput=290",
                   help="seconds per section child process")
    g.add_argument("--no-isolate", action="store_true", help="run sections in this process")
    g.add_argument("--child-section", help=argparse.SUPPRESS)
    g.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    g.add_argument("--child-deadline", type=float, default=None, help=argparse.SUPPRESS)  # epoch seconds
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if "--smoke" in argv:
        parser.set_defaults(**SMOKE_DEFAULTS)
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTION_NAMES))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTION_NAMES)}")
    args.timeouts = {k: float(v) for k, v in (kv.split("=") for kv in args.section_timeouts.split(",") if kv)}
    args.out = args.out or default_out()
    return args


def main() -> int:
    args = parse_args()
    if args.child_section:  # a child: run one section, its entry goes to --child-out
        run_section(args.child_section, args, lambda entry: write_json(args.child_out, entry))
        return 0
    report = new_report(args)
    for name in args.sections:
        log(f"section {name}: start")
        if args.no_isolate:
            entry = run_section(name, args, lambda e: None)
        else:
            entry = run_section_in_child(name, args.timeouts.get(name, 600.0))
        report["sections"][name] = entry
        report["meta"]["device"] = report["meta"]["device"] or entry.get("device")
        log(f"section {name}: {entry['status']} in {entry.get('seconds', 0):.0f} s")
        write_json(args.out, report)
    print_report(report)
    log(f"wrote {args.out}")
    return 0 if all(e["status"] == "ok" for e in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
