"""How fast could any engine run an offline workload on this CPU? A roofline from measured peaks.

An offline run's work is fixed by the workload, whatever the engine: the linear layers' FLOPs (every
prompt and output token through every layer, plus one LM-head row per output token) and the KV cache
that decode attention must read (each output token's whole context, every layer). This script counts
both for a preset and a `tram bench throughput` workload, measures on this machine

    GEMM peak   oneDNN's inner product on packed weights (what Tram and vLLM's CPU backend both run),
                the best GFLOP/s over the model's own shapes at large row counts
    KV read     the faster of Tram's decode-attention kernel on a large batch (GB/s of K/V read) and
                a plain streaming read of 512 MiB (torch.sum), the most any kernel could expect

and prints the floor: GEMM FLOPs / GEMM peak + KV bytes / KV read rate. An engine at the floor does
nothing but its GEMMs and its attention reads, at their best rates, with no host work at all. The
decode steps also read weights: with the requests decoding together from the first step (offline they
all arrive at once), step s reads every weight once for the requests with more than s output tokens
(of a mixture of experts only the experts they chose, by uniform routing); those bytes and the KV reads
at the best streaming rate are the memory floor, and the larger of the two floors counts. The floor by
phase is the schedule both engines run (every prompt prefilled, then the decode steps, layer after
layer): the prefill's FLOPs, then per step the LM head and the other weights each at the slower of
their FLOPs and their reads; where a step's LM head is compute-bound it is the higher of the two.
Given the JSON of a throughput run (--results), it prints each engine's time as a multiple of the
floor, and the ratio an engine at the floor would reach over the best vLLM configuration: a goal of
"N times vLLM" above that ratio cannot be met on this machine by any engine.

    python benchmarks/cpu_roofline.py --model llama-110m --dtype float32 --num-prompts 48 \\
        --input-len 32:256 --output-len 16:128 [--results run.json]

A mixture-of-experts model counts only its chosen experts' FLOPs, and its peak is measured on the
experts' shapes. --decode-step is the other floor, of one decode step at --batch (cpu_decode_floor.py):
the weight bytes it must read (of each MoE layer only the distinct experts its tokens chose, by
uniform routing and as Tram's router chose them), its KV reads and LM head, over the best streaming
read rate; Tram's measured step time is printed as a multiple of it, for the float model and, with
--gguf, for a GGUF file (a path, or a llama.cpp type such as Q4_K_M found in llama_cpp_peer.py's cache):

    python benchmarks/cpu_roofline.py --model qwen3-30b-a3b-4l --dtype bfloat16 --decode-step --batch 16 \\
        --gguf Q4_K_M

--prefill-results puts a `tram bench latency --prefill` run beside its GEMM roofline: each workload's
FLOPs (every prompt token through the linears, causal attention, one LM-head row per prompt) at the
packed GEMM peak of the run's model and dtype (a GGUF file's prefill decodes its weights into slabs
of the activations' dtype for the same GEMM):

    python benchmarks/cpu_roofline.py --prefill-results prefill.json
"""

from __future__ import annotations

import argparse
import json

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch
from cpu_decode_attention import make_inputs
from cpu_decode_floor import (
    moe_layout,
    run_decode_step,
    step_weight_bytes,
    stream_read_rate,
    table_from_config,
    uniform_distinct,
)
from transformers import AutoConfig

from tram.bench.datasets import make_requests
from tram.bench.presets import resolve_model
from tram.bench.report import machine_summary
from tram.bench.timing import best_ms
from tram.model.kernels.cpu_kernels import load_cpu_kernels, paged_decode_attention
from tram.model.layers.cpu_packed import pack_weight, packed_linear


def token_macs(cfg) -> int:
    """Multiply-adds of one token through every layer's linears (not the LM head)."""
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    per_token = layers * (h * heads * head_dim * 2 + 2 * h * kv_heads * head_dim + 3 * h * inter)
    moe = moe_layout(cfg)
    if moe is not None:  # a sparse layer runs its router and top_k experts instead of the dense MLP
        sparse_mlp = h * moe.num_experts + moe.top_k * 3 * h * moe.intermediate
        per_token += len(moe.sparse_layers) * (sparse_mlp - 3 * h * inter)
    return per_token


def workload_counts(cfg, prompt_lens: list[int], output_lens: list[int]) -> dict[str, float]:
    """Linear-layer FLOPs and decode K/V elements read, from the model's config."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    per_token = token_macs(cfg)
    tokens = sum(prompt_lens) + sum(output_lens) - len(prompt_lens)  # the last output token is never fed
    lm_rows = sum(output_lens)  # one logits row per sampled token
    gemm_flops = 2.0 * (tokens * per_token + lm_rows * h * cfg.vocab_size)
    # Output token j of a request (j >= 1) is computed from a context of prompt + j tokens.
    kv_elems = 0
    for p, o in zip(prompt_lens, output_lens):
        kv_elems += sum(p + j for j in range(1, o))
    kv_elems *= 2 * layers * kv_heads * head_dim
    return {"gemm_flops": gemm_flops, "kv_elements": float(kv_elems), "tokens": float(tokens)}


def decode_weight_bytes(cfg, elem: int, output_lens: list[int]) -> float:
    """Weight bytes the workload's decode steps read: step s (the first output token comes from the
    prefill) serves the requests with more than s output tokens."""
    table = table_from_config(cfg, elem)
    total = 0.0
    for s in range(1, max(output_lens)):
        batch = sum(1 for n in output_lens if n > s)
        total += sum(step_weight_bytes(table, batch, uniform_distinct(cfg, batch)).values())
    return total


def floor_by_phase(
    cfg, elem: int, prompt_lens: list[int], output_lens: list[int], peak: float, stream: float
) -> dict[str, float]:
    """Seconds of an engine that prefills every prompt before it decodes and runs its layers one after
    another (both engines' schedule for an offline batch): the prefill's FLOPs at the GEMM peak (it
    reads its weights once, far below its compute), then per decode step the LM head and the other
    weights each at the slower of their FLOPs (peak, GFLOP/s) and their bytes (stream, GB/s). A
    module's compute does not hide another's reads, so where the head is compute-bound (bf16 without
    AMX, batch 16 and up) this floor is above the whole-workload one. K/V reads are not counted."""
    h, vocab, per_token = cfg.hidden_size, cfg.vocab_size, token_macs(cfg)
    flops_s, bytes_s = 1.0 / (peak * 1e9), 1.0 / (stream * 1e9)
    prefill = 2.0 * (sum(prompt_lens) * per_token + len(prompt_lens) * h * vocab) * flops_s
    table, decode = table_from_config(cfg, elem), 0.0
    for s in range(1, max(output_lens)):
        batch = sum(1 for n in output_lens if n > s)
        parts = step_weight_bytes(table, batch, uniform_distinct(cfg, batch))
        head = max(parts["lm_head"] * bytes_s, 2.0 * batch * h * vocab * flops_s)
        rest_bytes = parts["experts"] + parts["whole"] + parts["embedding"]
        decode += head + max(rest_bytes * bytes_s, 2.0 * batch * per_token * flops_s)
    return {"prefill": prefill, "decode": decode}


def prefill_flops(cfg, batch: int, prompt_len: int) -> float:
    """FLOPs of prefilling `batch` prompts of `prompt_len` tokens and sampling one token each: every
    token through the linears, causal attention (QK^T and PV over the positions each query sees) and
    one LM-head row per prompt."""
    heads, layers = cfg.num_attention_heads, cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    linears = 2.0 * (prompt_len * token_macs(cfg) + cfg.hidden_size * cfg.vocab_size)
    attention = 2.0 * 2 * layers * heads * head_dim * prompt_len * (prompt_len + 1) / 2
    return batch * (linears + attention)


def report_prefill(path: str, cfg, peak: float, goal: float) -> None:
    """Each result of a `tram bench latency --prefill` run as a multiple of its GEMM roofline: all of
    its FLOPs (the prompts' linears and attention, one LM-head row each) at the packed GEMM peak."""
    with open(path, encoding="utf-8") as f:
        results = json.load(f)["results"]
    print(f"\n| workload | engine | last TTFT ms | floor ms | x floor (goal {goal:g}) | prefill tok/s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        batch, length = (int(x) for x in r["workload"].split("x"))
        floor_ms = prefill_flops(cfg, batch, length) / (peak * 1e9) * 1e3
        ratio = r["last_ms"] / floor_ms
        print(
            f"| {r['workload']} | {r['backend']} | {r['last_ms']:.0f} | {floor_ms:.0f} | {ratio:.2f}"
            f"{'' if ratio <= goal else ' (over)'} | {r['prefill_tokens_per_s']:.0f} |"
        )


def gemm_peak(cfg, dtype: torch.dtype, rows: list[int]) -> float:
    """Best GFLOP/s of the packed path over the model's weight shapes and the given row counts."""
    h, moe = cfg.hidden_size, moe_layout(cfg)
    inter = moe.intermediate if moe is not None else cfg.intermediate_size
    shapes = [(h, h), (2 * inter, h), (h, inter), (cfg.vocab_size, h)]
    best = 0.0
    for n, k in shapes:
        weight = torch.randn(n, k).to(dtype)
        packed = pack_weight(weight)
        if packed is None:
            raise SystemExit("this torch cannot pack weights for oneDNN; no packed peak to measure")
        for m in rows:
            x = torch.randn(m, k).to(dtype)
            ms = best_ms(lambda: packed_linear(x, packed, None), repeats=3, calls=3)
            best = max(best, 2.0 * m * n * k / (ms * 1e-3) / 1e9)
    return best


def kv_read_rate(cfg, dtype: torch.dtype, batch: int = 128) -> float:
    """GB/s of K/V that the decode kernel reads for one layer of a large, scattered batch (the
    inputs of benchmarks/cpu_decode_attention.py), or of a plain streaming read if that is faster."""
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    query, cache, tables, seq_lens = make_inputs(batch, heads, kv_heads, head_dim, dtype)
    ms = best_ms(lambda: paged_decode_attention(query, cache, tables, seq_lens, head_dim**-0.5), 5, 3)
    nbytes = int(seq_lens.sum()) * 2 * kv_heads * head_dim * cache.element_size()
    stream = torch.randn(2**27)  # 512 MiB, far past any cache
    stream_ms = best_ms(lambda: stream.sum(), 3, 3)
    return max(nbytes / (ms * 1e-3), stream.numel() * 4 / (stream_ms * 1e-3)) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-110m")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--input-len", default="32:256")
    p.add_argument("--output-len", default="16:128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--results", help="a `tram bench throughput --output-json` file of the same workload")
    p.add_argument(
        "--prefill-results",
        help="a `tram bench latency --prefill --output-json` file: each result against its GEMM roofline "
        "(--goal defaults to 1.5 here)",
    )
    p.add_argument("--decode-step", action="store_true", help="the floor of one decode step, and Tram's against it")
    p.add_argument("--batch", type=int, default=16, help="--decode-step: requests decoding together")
    p.add_argument("--context", type=int, default=256, help="--decode-step: each request's prompt tokens")
    p.add_argument("--steps", type=int, default=8, help="--decode-step: timed steps (after 2 warm-up steps)")
    p.add_argument(
        "--gguf",
        help="--decode-step: also a GGUF file: its path, or a llama.cpp type (Q4_K_M) converted by "
        "`llama_cpp_peer.py convert --model MODEL --dtype bfloat16 --gguf-type TYPE`",
    )
    p.add_argument(
        "--gguf-activations",
        default="float32",
        choices=["float32", "int8"],
        help="--decode-step: the GGUF file's activations (`--gguf-activations int8`: llama.cpp's numerics)",
    )
    p.add_argument("--float-only", action="store_true", help="--decode-step: skip the GGUF file")
    p.add_argument("--gguf-only", action="store_true", help="--decode-step: skip the float model")
    p.add_argument(
        "--modules",
        action="store_true",
        help="--decode-step: also each module class's ms per step (further steps, with hooks)",
    )
    p.add_argument("--goal", type=float, default=1.5, help="--decode-step, --prefill-results: the goal, x the floor")
    p.add_argument("--output-json", help="--decode-step: write the rows here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.decode_step:
        run_decode_step(args)
        return
    if args.prefill_results:
        run_prefill_floor(args)
        return
    with torch.inference_mode():
        assert load_cpu_kernels() is not None, "the CPU kernels failed to build"
        cfg = AutoConfig.from_pretrained(resolve_model(args.model))
        dtype = getattr(torch, args.dtype)
        reqs = make_requests(args.num_prompts, args.input_len, args.output_len, args.seed, vocab_size=cfg.vocab_size)
        counts = workload_counts(cfg, [r.prompt_len for r in reqs], [r.output_len for r in reqs])
        peak = gemm_peak(cfg, dtype, [512, 2048])
        rate = kv_read_rate(cfg, dtype)
        stream = stream_read_rate()
    elem = torch.empty((), dtype=dtype).element_size()
    gemm_s = counts["gemm_flops"] / (peak * 1e9)
    attn_s = counts["kv_elements"] * elem / (rate * 1e9)
    weight_bytes = decode_weight_bytes(cfg, elem, [r.output_len for r in reqs])
    weights_s = weight_bytes / (stream * 1e9)
    floor = max(gemm_s + attn_s, weights_s + attn_s)
    prompt_lens, output_lens = [r.prompt_len for r in reqs], [r.output_len for r in reqs]
    phases = floor_by_phase(cfg, elem, prompt_lens, output_lens, peak, stream)
    phased = phases["prefill"] + phases["decode"] + attn_s
    print(machine_summary())
    print(f"{args.model} {args.dtype}, {args.num_prompts} requests ({args.input_len} in, {args.output_len} out)")
    print(f"linear FLOPs {counts['gemm_flops'] / 1e12:.3f} T at a packed peak of {peak:.0f} GFLOP/s: {gemm_s:.2f} s")
    print(f"decode K/V read {counts['kv_elements'] * elem / 1e9:.2f} GB at {rate:.1f} GB/s: {attn_s:.2f} s")
    print(f"decode steps' weight reads {weight_bytes / 1e9:.1f} GB at {stream:.1f} GB/s: {weights_s:.2f} s")
    print(f"floor: {floor:.2f} s (compute {gemm_s + attn_s:.2f} s, memory {weights_s + attn_s:.2f} s)")
    print(
        f"floor by phase: {phased:.2f} s (prefill {phases['prefill']:.2f} s, decode steps {phases['decode']:.2f} s, "
        f"K/V {attn_s:.2f} s)"
    )
    if args.results:
        report_results(args.results, {"floor": floor, "floor by phase": phased})


def run_prefill_floor(args: argparse.Namespace) -> None:
    """--prefill-results: the model and dtype are the run's own; the peak is measured at 512 and 2048 rows."""
    with open(args.prefill_results, encoding="utf-8") as f:
        run = json.load(f)["args"]
    model = run["model"]
    if model.endswith(".gguf"):
        from tram.model.gguf.file import load_gguf_config

        cfg = load_gguf_config(model)
    else:
        cfg = AutoConfig.from_pretrained(resolve_model(model))
    dtype = getattr(torch, run["dtype"])  # a GGUF file's weights are decoded into GEMMs of this dtype
    with torch.inference_mode():
        assert load_cpu_kernels() is not None, "the CPU kernels failed to build"
        peak = gemm_peak(cfg, dtype, [512, 2048])
    print(machine_summary())
    print(f"{model} ({run['dtype']}): packed GEMM peak {peak:.0f} GFLOP/s ({dtype})")
    report_prefill(args.prefill_results, cfg, peak, args.goal)


def report_results(path: str, floors: dict[str, float]) -> None:
    """Each engine's best round as a multiple of each floor, and what an engine at it would be over vLLM."""
    with open(path, encoding="utf-8") as f:
        results = json.load(f)["results"]
    best: dict[str, float] = {}
    for r in results:
        best[r["backend"]] = min(best.get(r["backend"], float("inf")), r["seconds"])
    print("\n| engine | seconds | " + " | ".join(f"x {name}" for name in floors) + " |")
    print("|---|---|" + "---|" * len(floors))
    for name, sec in best.items():
        print(f"| {name} | {sec:.2f} | " + " | ".join(f"{sec / f:.2f}" for f in floors.values()) + " |")
    vllm = [s for n, s in best.items() if n.startswith("vllm")]
    for name, floor in floors.items() if vllm else ():
        print(
            f"an engine at the {name} would be {min(vllm) / floor:.2f}x the best vLLM configuration"
            + (f"; Tram is {min(vllm) / best['tram']:.2f}x" if "tram" in best else "")
        )


if __name__ == "__main__":
    main()
