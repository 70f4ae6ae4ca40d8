"""Micro-benchmark: the CPU paths a linear layer can take, per shape and row count, in GFLOP/s.

    F.linear   PyTorch's default (MKL sgemm for float32, oneDNN for bfloat16) on nn.Linear's layout
    packed     oneDNN's inner product on a weight reordered once (tram/model/layers/cpu_packed.py; what
               vLLM's CPU backend does with its onednn_mm)
    skinny     Tram's C++ kernel (csrc/skinny_linear.cpp), meant for a row or two
    pairs      bfloat16 only: Tram's C++ kernel on W packed in pairs of k (csrc/pair_linear.cpp, builds
               with AVX512-BF16), what a bf16 LM head takes where the build prefers it (no AMX)

Shapes are the 110M preset's (hidden 768, MLP 2048, vocabulary 32000; gate and up side by side as
4096) and Qwen3-30B-A3B's LM head (--shapes picks). Each time is the minimum over --repeats runs of
--calls calls, since the machine may be shared. To see what a CPU without AVX-512 gets from the same
libraries on an AVX-512 machine, run it with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2 (the skinny kernel stays compiled for this CPU).

    python benchmarks/cpu_linear_paths.py [--rows 1 2 4 16 48 128 512] [--dtype float32 bfloat16]
    python benchmarks/cpu_linear_paths.py --shapes "lm_head 151936x2048" --dtype bfloat16 --rows 1 4 8 16 32 64
"""

from __future__ import annotations

import argparse

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch
import torch.nn.functional as F

from tram.bench.report import machine_summary
from tram.bench.timing import best_ms
from tram.model.kernels.cpu_kernels import load_cpu_kernels, skinny_linear
from tram.model.layers.cpu_packed import pack_weight, packed_linear

SHAPES = {
    "qkv/o 768x768": (768, 768),
    "gate+up 4096x768": (4096, 768),
    "down 768x2048": (768, 2048),
    "lm_head 32000x768": (32000, 768),
    "lm_head 151936x2048": (151936, 2048),
}
DEFAULT_SHAPES = list(SHAPES)[:4]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 16, 48, 128, 512])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    kernels = load_cpu_kernels()
    assert kernels is not None, "the CPU kernels failed to build"
    torch.set_num_threads(args.threads)
    print(machine_summary() + "\n")
    paths = "F.linear GFLOP/s | packed GFLOP/s | skinny GFLOP/s | pairs GFLOP/s"
    print(f"| weight | dtype | rows | {paths} | packed ÷ F.linear |")
    print("|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for dtype in (getattr(torch, d) for d in args.dtype):
            for name in args.shapes:
                n, k = SHAPES[name]
                weight = (torch.randn(n, k) * 0.05).to(dtype)
                packed = pack_weight(weight)
                pairs = kernels.pair_pack(weight) if dtype == torch.bfloat16 and kernels.pair_linear_built() else None
                for m in args.rows:
                    x = torch.randn(m, k).to(dtype)
                    gflop = 2 * m * n * k / 1e9
                    base = best_ms(lambda: F.linear(x, weight), args.repeats, args.calls)
                    pk = (
                        best_ms(lambda: packed_linear(x, packed, None), args.repeats, args.calls)
                        if packed is not None
                        else float("nan")
                    )
                    sk = (
                        best_ms(lambda: skinny_linear(x, weight), args.repeats, args.calls)
                        if m <= 128
                        else float("nan")
                    )
                    pr = (
                        best_ms(lambda: kernels.pair_linear(x, pairs, n), args.repeats, args.calls)
                        if pairs is not None
                        else float("nan")
                    )
                    print(
                        f"| {name} | {str(dtype)[6:]} | {m} | {gflop / base * 1e3:.0f} | {gflop / pk * 1e3:.0f} | "
                        f"{gflop / sk * 1e3:.0f} | {gflop / pr * 1e3:.0f} | {base / pk:.2f}x |"
                    )


if __name__ == "__main__":
    main()
