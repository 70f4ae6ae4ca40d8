"""Micro-benchmark: a linear layer with a few rows of input on CPU, F.linear vs the skinny kernel.

The weights are the logits projection of the 15M preset (32000 x 288) and the MLP of the 110M preset
(3072 x 768). Each time is the minimum over --repeats runs of --calls calls, since the machine may be
shared; GB/s counts the weight bytes read by the kernel.

    python benchmarks/cpu_skinny_linear.py [--rows 1 4 8 16] [--threads 1 2]
"""

from __future__ import annotations

import argparse

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch
import torch.nn.functional as F

from tram.bench.report import machine_summary
from tram.bench.timing import best_ms
from tram.model.kernels.cpu_kernels import load_cpu_kernels, skinny_linear

WEIGHTS = {"32000x288": (32000, 288), "3072x768": (3072, 768)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    assert load_cpu_kernels() is not None, "the CPU kernels failed to build"
    print(machine_summary() + " (threads set per row below)\n")
    print("| weight | dtype | threads | rows | F.linear ms | kernel ms | kernel GB/s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.bfloat16):
            for name, (n, k) in WEIGHTS.items():
                weight = (torch.randn(n, k) * 0.05).to(dtype)
                for m in args.rows:
                    x = torch.randn(m, k).to(dtype)
                    with torch.inference_mode():
                        ref = best_ms(lambda: F.linear(x, weight), args.repeats, args.calls)
                        ours = best_ms(lambda: skinny_linear(x, weight), args.repeats, args.calls)
                    gbps = weight.numel() * weight.element_size() / ours / 1e6
                    print(
                        f"| {name} | {str(dtype)[6:]} | {threads} | {m} | {ref:.3f} | {ours:.3f} | {gbps:.1f} "
                        f"| {ref / ours:.2f}x |"
                    )


if __name__ == "__main__":
    main()
