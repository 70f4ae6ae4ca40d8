"""Weight-only int8 and int4 (quantized at load) against the float model, in one run each.

    python benchmarks/quant_cpu.py kernels [--rows 1 4 16 32 64 256]     # one linear layer, per shape and row count
    python benchmarks/quant_cpu.py gguf-kernels FILE.gguf ... [--rows ...]  # the same for a GGUF file's layers
    python benchmarks/quant_cpu.py throughput --model llama-110m [--max-num-seqs 1 4 16]

`kernels`: a quantized linear against the float32 and bfloat16 paths Tram runs on the same shape
(tram/model/layers/linear.py), on the ~0.5B preset's shapes (Qwen2.5-0.5B: hidden 896, MLP 4864, 2 KV
heads of 64); each time is the minimum over --repeats runs of --calls calls, the paths taking turns
in every run (the machine may be shared: a burst of load then slows all paths alike). `throughput`: the same
requests through the float model and its int8 and int4 versions, taking turns, at each batch limit;
output tokens/s and greedy agreement with the float model.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch

from tram.bench.report import machine_summary
from tram.model.layers.cpu_packed import pack_weight
from tram.model.layers.linear import linear
from tram.model.quant.weights import Int4Weight, Int8Weight, int4_group_size

SHAPES = {
    "q/o 896x896": (896, 896),
    "k/v 128x896": (128, 896),
    "gate/up 4864x896": (4864, 896),
    "down 896x4864": (896, 4864),
}


def _interleaved_ms(fns: dict[str, Callable[[], object]], repeats: int, calls: int) -> dict[str, float]:
    """ms per call of each fn: the best of `repeats` loops of `calls` calls, the fns taking turns in
    every repeat, so that a burst of load from the machine's other users slows all of them alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e3)
    return best


def kernels(args: argparse.Namespace) -> None:
    columns = [
        "float32 µs",
        "bfloat16 µs",
        "int8 µs",
        "int4 µs",
        "int8 speed-up vs fp32",
        "int4 vs fp32",
        "int4 vs bf16",
    ]
    print("| weight | rows | " + " | ".join(columns) + " |")
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
                t = _interleaved_ms(
                    {
                        "fp32": lambda: linear(x32, w32, None, packed32),
                        "bf16": lambda: linear(x16, w16, None, packed16),
                        "int8": lambda: q8.apply(x32, None),
                        "int4": lambda: q4.apply(x32, None),
                    },
                    args.repeats,
                    args.calls,
                )
                print(
                    f"| {name} | {m} | {t['fp32'] * 1e3:.0f} | {t['bf16'] * 1e3:.0f} | {t['int8'] * 1e3:.0f} | "
                    f"{t['int4'] * 1e3:.0f} | {t['fp32'] / t['int8']:.2f}× | {t['fp32'] / t['int4']:.2f}× | "
                    f"{t['bf16'] / t['int4']:.2f}× |"
                )


def gguf_kernels(args: argparse.Namespace) -> None:
    """Each linear of the first two layers of GGUF files (their real block types: a Q4_K_M file
    mixes Q5_0, Q8_0, Q4_K and Q6_K) against float32 and bfloat16 on the same shape, with float32
    activations (the default), with --gguf-activations int8 and with bfloat16 ones (--dtype bfloat16:
    from slab_gemm.MIN_ROWS rows on, bf16 slabs for oneDNN where bf16 GEMMs are native)."""
    import numpy as np

    from tram.model.gguf.file import open_gguf
    from tram.model.gguf.weight import GGUF_KEPT_TYPES, GGUFWeight

    print(
        "| file | tensor | type | rows | float32 µs | bfloat16 µs | gguf µs | gguf int8 µs | gguf bf16 µs | "
        "gguf vs fp32 | int8 vs fp32 | int8 vs gguf | gguf bf16 vs bf16 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for path in args.files:
            for t in open_gguf(path).tensors:
                if not t.name.startswith(tuple(args.tensors)) or int(t.tensor_type) not in GGUF_KEPT_TYPES:
                    continue
                qw = GGUFWeight(torch.from_numpy(np.array(t.data)), int(t.tensor_type), int(t.shape[0]))
                qi = GGUFWeight(qw.data, qw.ggml_type, qw.in_features, int8_activations=True)
                w32 = qw.dequantize()
                w16 = w32.bfloat16()
                packed32, packed16 = pack_weight(w32), pack_weight(w16)
                for m in args.rows:
                    x32 = torch.randn(m, qw.in_features)
                    x16 = x32.bfloat16()
                    ms = _interleaved_ms(
                        {
                            "fp32": lambda: linear(x32, w32, None, packed32),
                            "bf16": lambda: linear(x16, w16, None, packed16),
                            "gguf": lambda: qw.apply(x32, None),
                            "int8": lambda: qi.apply(x32, None),
                            "gguf_bf16": lambda: qw.apply(x16, None),
                        },
                        args.repeats,
                        args.calls,
                    )
                    f32, b16, q, i8, qb = ms["fp32"], ms["bf16"], ms["gguf"], ms["int8"], ms["gguf_bf16"]
                    print(
                        f"| {path.rsplit('-', 1)[-1]} | {t.name} {qw.out_features}x{qw.in_features} | "
                        f"{t.type_name} | {m} | {f32 * 1e3:.0f} | {b16 * 1e3:.0f} | {q * 1e3:.0f} | {i8 * 1e3:.0f} | "
                        f"{qb * 1e3:.0f} | {f32 / q:.2f}× | {f32 / i8:.2f}× | {q / i8:.2f}× | {b16 / qb:.2f}× |",
                        flush=True,
                    )


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
    print(
        f"{args.model} float32, {len(requests)} requests ({args.input_len} in, {args.output_len} out), "
        f"{sum(r.output_len for r in requests)} output tokens\n"
    )
    print(
        "| max_num_seqs | float32 tok/s | int8 tok/s | int4 tok/s | int8 ÷ float32 | int4 ÷ float32 | "
        "greedy equal to float32 (int8, int4) |"
    )
    print("|---|---|---|---|---|---|---|")
    for seqs in args.max_num_seqs:
        rates, outputs = {}, {}
        for method in (None, "int8", "int4"):
            seconds, outputs[method] = _run(model, method, requests, seqs)
            rates[method] = sum(map(len, outputs[method])) / seconds
        same = [sum(a == b for a, b in zip(outputs[m], outputs[None])) for m in ("int8", "int4")]
        print(
            f"| {seqs} | {rates[None]:.1f} | {rates['int8']:.1f} | {rates['int4']:.1f} | "
            f"{rates['int8'] / rates[None]:.2f}× | {rates['int4'] / rates[None]:.2f}× | "
            f"{same[0]}/{len(requests)}, {same[1]}/{len(requests)} |",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels")
    k.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    k.add_argument("--calls", type=int, default=20)
    k.add_argument("--repeats", type=int, default=7)
    g = sub.add_parser("gguf-kernels")
    g.add_argument("files", nargs="+", help="GGUF files (llama_cpp_peer.py makes them)")
    g.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    g.add_argument("--tensors", nargs="+", default=["blk.0."], help="tensor name prefixes to time")
    g.add_argument("--calls", type=int, default=20)
    g.add_argument("--repeats", type=int, default=7)
    t = sub.add_parser("throughput")
    t.add_argument("--model", default="llama-110m")
    t.add_argument("--num-prompts", type=int, default=16)
    t.add_argument("--input-len", default="32:128")
    t.add_argument("--output-len", default="64:128")
    t.add_argument("--max-num-seqs", type=int, nargs="+", default=[1, 4, 16])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_summary() + "\n")
    {"kernels": kernels, "gguf-kernels": gguf_kernels, "throughput": throughput}[args.command](args)


if __name__ == "__main__":
    main()
