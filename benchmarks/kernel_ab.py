"""Two builds of Tram's C++ kernels, side by side in one process: the K-quant int8-activation linear
(`gguf_linear_int8`) of each build timed on the same weights and rows, calls taking turns.

    python benchmarks/kernel_ab.py BEFORE.so AFTER.so [--rows 1 4 16 64 256] [--tensors lm_head attn_q o]
    python benchmarks/kernel_ab.py BEFORE.so AFTER.so --moe-tokens 1 16 64 512   # the fused MoE kernel
    python benchmarks/kernel_ab.py BEFORE.so AFTER.so --moe-tokens 32 64 128 --moe-format bf16  # bf16 experts
    python benchmarks/kernel_ab.py SO SO --repack-after [--moe-tokens ...]  # one build: file layout vs repacked
    python benchmarks/kernel_ab.py BEFORE.so AFTER.so --repack-both [--moe-tokens ...]  # both repacked

A build is a folder that `TORCH_EXTENSIONS_DIR=FOLDER tram build-kernels` filled (every kernel
family's module), or one family's `.so` from torch's extension cache (one folder per family and
source hash): build the commit before a change, then the change, and pass both. On a VM whose speed
drifts between runs minutes apart, two runs compare poorly; here every timing of one build sits
between two of the other, so a drift slows both alike. Caution: the two builds share one process,
so they share their GNU-unique symbols (the statics of inline functions and templates, such as a
table of function pointers filled by the first build): where a kernel has such statics, the second
build can run the first one's code and the two compare equal when they are not. kernel_ab_suite.py
runs each build in a process of its own; prefer it, and confirm a result here there or end to end.
The two builds' outputs are checked to agree (the kernels are exact in integers; a change of float
order would show as a relative difference).

The weights are random blocks of the shapes of the MoE preset (qwen3-30b-a3b-4l: Q6_K LM head
151936x2048, Q4_K attention projections), with scales of 1e-3 so that no sum overflows. With
--moe-tokens, one MoE layer of that preset instead (128 experts, top 8, hidden 2048, expert width
768; gate/up Q4_K and down Q6_K as Q4_K_M writes them, int8 activations), routed at random, through
the fused MoE kernel of each build; with --moe-format bf16 the experts are bfloat16 instead (random
normal / sqrt(K)), and the builds' outputs agree within bf16's rounding (the two may send an expert
down different paths). With --repack-after the second build's K-quant weights are repacked eight rows
at a time (csrc/gguf_x8.h, its own float order: the outputs are checked to agree within the
activations' quantization instead of exactly).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import numpy as np
import torch

from tram.bench.report import machine_summary

Q4_K, Q6_K = 12, 14
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}
MOE_EXPERTS = 128
TENSORS = {  # name: (ggml type, N, K)
    "lm_head": (Q6_K, 151936, 2048),
    "attn_q": (Q4_K, 4096, 2048),
    "o": (Q4_K, 2048, 4096),
}


def load_build(path: str) -> Any:
    """A build's kernels: one extension module (a `.so`), or every family's module under a folder (a
    TORCH_EXTENSIONS_DIR that `tram build-kernels` filled) as one namespace."""
    if not os.path.isdir(path):
        return _load_module(path)
    found = sorted(glob.glob(os.path.join(path, "**", "tram_cpu_kernels_*.so"), recursive=True))
    if not found:
        raise ValueError(f"no tram_cpu_kernels_*.so under {path}")
    merged = SimpleNamespace()
    for module in map(_load_module, found):
        for name in dir(module):
            if not name.startswith("_"):
                setattr(merged, name, getattr(module, name))
    return merged


def _load_module(path: str) -> ModuleType:
    name = path.rstrip("/").split("/")[-1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_blocks(ggml_type: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    data = np.random.default_rng(seed).integers(0, 256, size=(n, k // 256, BLOCK_BYTES[ggml_type]), dtype=np.uint8)
    half = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    if ggml_type == Q4_K:
        data[:, :, 0:2] = half  # d
        data[:, :, 2:4] = half  # dmin
    else:
        data[:, :, 208:210] = half  # d
    return torch.from_numpy(data.reshape(n, -1).copy())


def time_pair(
    builds: list[Any], x: torch.Tensor, weights: list[tuple[torch.Tensor, int]], calls: int, repeats: int
) -> list[float]:
    best = [float("inf")] * len(builds)
    for _ in range(repeats):
        for i, build in enumerate(builds):
            w, ggml_type = weights[i]
            start = time.perf_counter()
            for _ in range(calls):
                build.gguf_linear_int8(x, w, ggml_type, None)
            best[i] = min(best[i], (time.perf_counter() - start) / calls)
    return best


def repacked(build: Any, w: torch.Tensor, ggml_type: int, repack: bool) -> tuple[torch.Tensor, int]:
    """(weight, type) as this build multiplies it: repacked eight rows at a time with `repack`."""
    if not repack:
        return w, ggml_type
    packed = build.gguf_x8_pack(w.reshape(-1, w.shape[-1]), ggml_type)
    return packed.reshape(*w.shape[:-1], -1), build.gguf_x8_type(ggml_type)


def moe_weights(ggml_type: int, rows: int, k: int, seed: int, build: Any, repack: bool) -> Any:
    from tram.model.layers.moe.experts import ExpertWeights

    data = random_blocks(ggml_type, MOE_EXPERTS * rows, k, seed).view(MOE_EXPERTS, rows, -1)
    data, ggml_type = repacked(build, data, ggml_type, repack)
    return ExpertWeights("gguf", data, rows, k, ggml_type=ggml_type, int8_activations=True)


def bf16_experts(rows: int, k: int, seed: int) -> Any:
    from tram.model.layers.moe.experts import ExpertWeights

    gen = torch.Generator().manual_seed(seed)
    data = (torch.randn(MOE_EXPERTS, rows, k, generator=gen) / k**0.5).to(torch.bfloat16)
    return ExpertWeights("float", data, rows, k)


def moe_rows(builds: list[Any], tokens: list[int], repeats: int, repack: list[bool], down: int | None) -> None:
    """The fused MoE kernel of each build on one layer of the preset, per token count; repack[i]: build i's
    weights repacked eight rows at a time; down None: bfloat16 experts (the same tensors for both)."""
    import tram.model.layers.moe.cpu_kernel as cpu_kernel

    hidden, width, top_k = 2048, 768, 8
    if down is None:
        layers = [(bf16_experts(2 * width, hidden, 1), bf16_experts(hidden, width, 2))] * len(builds)
    else:
        layers = [
            (
                moe_weights(Q4_K, 2 * width, hidden, 1, build, repack[i]),
                moe_weights(down, hidden, width, 2, build, repack[i]),
            )
            for i, build in enumerate(builds)
        ]
    print("| tokens | before ms | after ms | after / before | GMAC/s before -> after |")
    print("|---|---|---|---|---|")
    for count in tokens:
        gen = torch.Generator().manual_seed(count)
        x = torch.randn(count, hidden, generator=gen).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(MOE_EXPERTS, generator=gen)[:top_k] for _ in range(count)]).to(torch.int32)
        weights = torch.full((count, top_k), 1.0 / top_k)
        best, outs = [float("inf")] * len(builds), []
        calls = max(1, 64 // count)
        for rep in range(repeats + 1):  # the first round checks the outputs and warms up
            for i, build in enumerate(builds):
                cpu_kernel.kernels_for = lambda x, build=build: build  # this build's kernel
                w13, w2 = layers[i]
                start = time.perf_counter()
                for _ in range(calls):
                    out = cpu_kernel.cpu_fused_moe(x, ids, weights, w13, w2, None, None, "silu")
                if rep == 0:
                    outs.append(out)
                else:
                    best[i] = min(best[i], (time.perf_counter() - start) / calls)
        diff = ((outs[0].float() - outs[1].float()).abs().max() / outs[0].float().abs().max()).item()
        if diff > (2e-2 if repack[0] != repack[1] or down is None else 0.0):
            raise SystemExit(f"{count} tokens: the builds' MoE outputs differ by {diff:.2e} of their scale")
        macs = count * top_k * 3 * hidden * width
        before, after = best
        rates = f"{macs / before / 1e9:.0f} -> {macs / after / 1e9:.0f}"
        print(f"| {count} | {before * 1e3:.1f} | {after * 1e3:.1f} | {after / before:.2f} | {rates} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--tensors", nargs="+", default=list(TENSORS), choices=list(TENSORS))
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--moe-tokens", type=int, nargs="+", help="time the fused MoE kernel at these token counts")
    parser.add_argument("--moe-down", choices=["Q4_K", "Q6_K"], default="Q6_K", help="the MoE layer's down type")
    parser.add_argument(
        "--moe-format", choices=["q4km", "bf16"], default="q4km", help="the experts: Q4_K_M's blocks or bfloat16"
    )
    parser.add_argument(
        "--repack-after", action="store_true", help="the second build's weights repacked (Q4_K x8, Q6_K x8)"
    )
    parser.add_argument("--repack-both", action="store_true", help="both builds' weights repacked")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    builds = [load_build(args.before), load_build(args.after)]
    print(machine_summary())
    if args.moe_tokens:
        down = None if args.moe_format == "bf16" else Q4_K if args.moe_down == "Q4_K" else Q6_K
        repack = [args.repack_both, args.repack_both or args.repack_after]
        moe_rows(builds, args.moe_tokens, args.repeats, repack, down)
        return
    print("| tensor | type | rows | before µs | after µs | after / before |")
    print("|---|---|---|---|---|---|")
    for name in args.tensors:
        ggml_type, n, k = TENSORS[name]
        w = random_blocks(ggml_type, n, k)
        weights = [
            repacked(b, w, ggml_type, args.repack_both or (args.repack_after and i == 1)) for i, b in enumerate(builds)
        ]
        for rows in args.rows:
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            ys = [b.gguf_linear_int8(x, *weights[i], None) for i, b in enumerate(builds)]
            diff = ((ys[0] - ys[1]).abs().max() / ys[0].abs().max()).item()
            if diff > (
                1e-4 if args.repack_after and not args.repack_both else 1e-5
            ):  # the repacked layout's own float order
                raise SystemExit(f"{name} at {rows} rows: the builds disagree by {diff:.2e} of the output's scale")
            calls = 2 if n > 100_000 else 20
            before, after = time_pair(builds, x, weights, calls, args.repeats)
            kind = "Q6_K" if ggml_type == Q6_K else "Q4_K"
            cells = f"{before * 1e6:,.0f} | {after * 1e6:,.0f} | {after / before:.2f}"
            print(f"| {name} {n}x{k} | {kind} | {rows} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
