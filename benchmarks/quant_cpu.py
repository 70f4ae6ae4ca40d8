"""Weight-only int8 and int4 (quantized at load) against the float model, in one run each.

    python benchmarks/quant_cpu.py kernels [--rows 1 4 16]     # one linear layer, per shape and row count
    python benchmarks/quant_cpu.py throughput --model llama-110m [--max-num-seqs 1 4 16]

`kernels`: a quantized linear against the float32 and bfloat16 paths Tram runs on the same shape
(tram/model/linear.py), on the ~0.5B preset's shapes (Qwen2.5-0.5B: hidden 896, MLP 4864, 2 KV
heads of 64); each time is the minimum over --repeats runs of --calls calls. `throughput`: the same
requests through the float model and its int8 and int4 versions, taking turns, at each batch limit;
output tokens/s and greedy agreement with the float model.
"""
from __future__ import annotations

import argparse
import gc

import torch

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
from tram.bench.report import machine_summary
from tram.bench.timing import best_ms
from tram.model.cpu_packed import pack_weight
from tram.model.linear import linear
from tram.model.quant.weights import Int4Weight, Int8Weight, int4_group_size

SHAPES = {"q/o 896x896": (896, 896), "k/v 128x896": (128, 896), "gate/up 4864x896": (4864, 896),
          "down 896x4864": (896, 4864)}


def kernels(args: argparse.Namespace) -> None:
    print("| weight | rows | float32 µs | bfloat16 µs | int8 µs | int4 µs | int8 speed-up vs fp32 | int4 vs fp32 | int4 vs bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for name, (n, k) in SHAPES.items():
            w32 = torch.randn(n, k) * 0.05
            w16 = w32.bfloat16()
            packed32, packed16 = pack_weight(w32), pack_weight(w16)
            q8, q4 = Int8Weight(w32), Int4Weight(w32, int4_group_size(k))
            for m in args.rows:
                x32 = torch.randn(m, k)
                x16 = x32.bfloat16()
                t = {
                    "fp32": best_ms(lambda: linear(x32, w32, None, packed32), args.repeats, args.calls),
                    "bf16": best_ms(lambda: linear(x16, w16, None, packed16), args.repeats, args.calls),
                    "int8": best_ms(lambda: q8.apply(x32, None), args.repeats, args.calls),
                    "int4": best_ms(lambda: q4.apply(x32, None), args.repeats, args.calls),
                }
                print(f"| {name} | {m} | {t['fp32'] * 1e3:.0f} | {t['bf16'] * 1e3:.0f} | {t['int8'] * 1e3:.0f} | "
                      f"{t['int4'] * 1e3:.0f} | {t['fp32'] / t['int8']:.2f}× | {t['fp32'] / t['int4']:.2f}× | "
                      f"{t['bf16'] / t['int4']:.2f}× |")


def _run(model: str, method: str | None, requests: list, max_num_seqs: int) -> tuple[float, list]:
    from tram import LLM
    from tram.bench.throughput import timed_greedy

    llm = LLM(model, quantization=method, max_num_seqs=max_num_seqs, max_model_len=1024)
    result = timed_greedy(llm, requests)
    del llm
    gc.collect()
    return result


def throughput(args: argparse.Namespace) -> None:
    from transformers import AutoConfig

    from tram.bench.datasets import parse_range, random_requests
    from tram.bench.presets import checkpoint_for

    model = checkpoint_for(args.model, "float32")
    vocab = AutoConfig.from_pretrained(model).vocab_size
    requests = random_requests(args.num_prompts, parse_range(args.input_len), parse_range(args.output_len), vocab)
    print(f"{args.model} float32, {len(requests)} requests ({args.input_len} in, {args.output_len} out), "
          f"{sum(r.output_len for r in requests)} output tokens\n")
    print("| max_num_seqs | float32 tok/s | int8 tok/s | int4 tok/s | int8 ÷ float32 | int4 ÷ float32 | "
          "greedy equal to float32 (int8, int4) |")
    print("|---|---|---|---|---|---|---|")
    for seqs in args.max_num_seqs:
        rates, outputs = {}, {}
        for method in (None, "int8", "int4"):
            seconds, outputs[method] = _run(model, method, requests, seqs)
            rates[method] = sum(map(len, outputs[method])) / seconds
        same = [sum(a == b for a, b in zip(outputs[m], outputs[None])) for m in ("int8", "int4")]
        print(f"| {seqs} | {rates[None]:.1f} | {rates['int8']:.1f} | {rates['int4']:.1f} | "
              f"{rates['int8'] / rates[None]:.2f}× | {rates['int4'] / rates[None]:.2f}× | "
              f"{same[0]}/{len(requests)}, {same[1]}/{len(requests)} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels")
    k.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    k.add_argument("--calls", type=int, default=20)
    k.add_argument("--repeats", type=int, default=7)
    t = sub.add_parser("throughput")
    t.add_argument("--model", default="llama-110m")
    t.add_argument("--num-prompts", type=int, default=16)
    t.add_argument("--input-len", default="32:128")
    t.add_argument("--output-len", default="64:128")
    t.add_argument("--max-num-seqs", type=int, nargs="+", default=[1, 4, 16])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_summary() + "\n")
    kernels(args) if args.command == "kernels" else throughput(args)


if __name__ == "__main__":
    main()
