"""Micro-benchmark: an attention layer's q/k/v projections as three packed GEMMs or one stacked.

On CPU, `pack_cpu_linears` packs q, k and v of every attention layer as one [(H + 2 Hkv) D, hidden]
weight (`Attention.pack_stacked`); past the skinny kernel's rows one oneDNN call then runs the three.
This times `Attention.project_qkv` over a model's layers (each layer its own weights, so they come
from memory as in a step) with the stacked weight and with three packed weights, taking turns in one
process, per row count. Presets' shapes: llama-110m (hidden 768, 12 / 12 heads of 64, 12 layers) and
the MoE preset's attention (hidden 2048, 32 / 4 heads of 128, 4 layers).

    python benchmarks/cpu_stacked_qkv.py [--rows 4 8 16 32 64 512] [--dtypes bfloat16 float32]
"""

from __future__ import annotations

import argparse
import time

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch

from tram.bench.report import machine_summary
from tram.model.layers.attention import Attention
from tram.model.layers.cpu_packed import pack_cpu_linears

SHAPES = {"llama-110m": (768, 12, 12, 64, 12), "qwen3-30b-a3b-4l": (2048, 32, 4, 128, 4)}


def layers(shape: tuple[int, ...], dtype: torch.dtype, stacked: bool) -> list[Attention]:
    hidden, heads, kv_heads, head_dim, count = shape
    out = []
    for i in range(count):
        torch.manual_seed(i)
        attn = Attention(hidden, heads, kv_heads, head_dim, backend=None, dtype=dtype, qkv_bias=False, o_bias=False)  # type: ignore[arg-type]
        for p in attn.parameters():
            torch.nn.init.normal_(p, std=0.02)
        attn.eval().requires_grad_(False)
        if not stacked:  # what pack_cpu_linears did before: each projection packed on its own
            attn.pack_stacked = lambda pack: None  # type: ignore[method-assign]
        holder = torch.nn.Module()
        holder.attn = attn
        pack_cpu_linears(holder)
        out.append(attn)
    return out


def best_ms(mods: list[Attention], x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        for attn in mods:
            attn.project_qkv(x)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32, 64, 512])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_summary())
    print("\n| model | dtype | rows | three GEMMs ms | stacked ms | stacked / three |\n|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        for dname in args.dtypes:
            dtype = getattr(torch, dname)
            three, stacked = layers(shape, dtype, False), layers(shape, dtype, True)
            for rows in args.rows:
                x = torch.randn(rows, shape[0]).to(dtype)
                calls = 3 if rows < 100 else 1
                times = {"three": float("inf"), "stacked": float("inf")}
                with torch.inference_mode():
                    for _ in range(args.repeats):  # taking turns, so a drift of the machine hits both
                        times["three"] = min(times["three"], best_ms(three, x, calls))
                        times["stacked"] = min(times["stacked"], best_ms(stacked, x, calls))
                print(
                    f"| {name} ({shape[4]} layers) | {dname} | {rows} | {times['three']:.2f} | "
                    f"{times['stacked']:.2f} | {times['stacked'] / times['three']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
