"""The skinny kernel against oneDNN's packed GEMM on small and large float32 weights, few rows: the
measurement behind SMALL_WEIGHT_ELEMENTS (tram/model/layers/linear.py). Warm weights, microseconds
per call.

    python3 benchmarks/cpu_small_weights.py [--threads 2] [--rows 1,3,5,8]
"""

from __future__ import annotations

import argparse
import time

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch

from tram.model.kernels.cpu_kernels import load_cpu_kernels
from tram.model.layers.cpu_packed import pack_weight, packed_linear

SHAPES = [(64, 64), (344, 64), (64, 172), (288, 288), (2304, 768), (2048, 2048), (4096, 576)]


def per_call_us(fn, repeat: int) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,3,5,8", help="comma-separated row counts")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    torch.set_num_threads(args.threads)
    kernels = load_cpu_kernels()
    print(f"{'weight':>12} {'rows':>4} {'skinny us':>10} {'oneDNN us':>10}")
    with torch.inference_mode():
        for n, k in SHAPES:
            w = torch.randn(n, k)
            packed = pack_weight(w)
            repeat = 2000 if n * k < 1_000_000 else 200
            for m in rows:
                x = torch.randn(m, k)
                skinny = per_call_us(lambda: kernels.skinny_linear(x, w, None), repeat)
                onednn = per_call_us(lambda: packed_linear(x, packed, None), repeat)
                print(f"{n:>5} x {k:<5} {m:>4} {skinny:>10.1f} {onednn:>10.1f}")


if __name__ == "__main__":
    main()
