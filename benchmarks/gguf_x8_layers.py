"""A GGUF model's linears with int8 activations in two layouts, in one process: the file's blocks
(csrc/gguf_int8.cpp's row kernel) against the 32-weight types repacked eight rows at a time (Q5_0 x8,
Q8_0 x8; csrc/gguf_q5_0_x8.h), which the loader chooses where the build prefers them.

Every decoder layer's q/k/v (one call), o, gate/up (one call) and down are called in order as a decode
step calls them, so that the weights come from memory as they do in a step (a small model's layers
together outgrow the L3), then the LM head alone. The two layouts take turns round by round, so a
drift of the VM's speed slows both alike; the median of --reps passes per round is printed.

    python3 benchmarks/gguf_x8_layers.py FILE.gguf [--rows 1 16 256] [--tokenizer smollm2-135m]
    python3 benchmarks/gguf_x8_layers.py smollm2-135m --gguf-type Q4_K_M   # llama_cpp_peer.py's file

Run with the AVX2 build (TRAM_CPU_MARCH=x86-64-v3 and the ISA caps of docs/benchmarks.md) to see
the AVX2 kernels.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)


def load(args: argparse.Namespace) -> Any:
    from cpu_decode_floor import gguf_file

    from tram import LLM
    from tram.bench.presets import resolve_model

    path, tokenizer = args.model, resolve_model(args.tokenizer) if args.tokenizer else None
    if args.gguf_type:
        path, tokenizer = gguf_file(args.gguf_type, args.model, 0), resolve_model(args.model)
    llm = LLM(path, tokenizer=tokenizer, dtype="float32", max_model_len=256, gguf_activations="int8")
    return llm.llm_engine.engine_core.executor.model_runner.model


def weights(model: Any) -> tuple[list[dict[str, Any]], Any]:
    """Each layer's GGUF weights by module name, and the LM head's."""
    from tram.model.gguf.weight import GGUFWeight

    layers: dict[int, dict[str, Any]] = {}
    head = None
    for name, module in model.named_modules():
        for value in vars(module).values():
            if not isinstance(value, GGUFWeight):
                continue
            if ".layers." in name:
                index = int(name.split(".layers.")[1].split(".")[0])
                layers.setdefault(index, {})[name.split(".")[-1]] = value
            else:
                head = value
    return [layers[i] for i in sorted(layers)], head


def in_file_layout(kernels: Any, weight: Any) -> tuple[Any, int]:
    from tram.model.gguf.weight import REPACKED

    if weight.ggml_type in REPACKED and REPACKED[weight.ggml_type] in (6, 8):  # Q5_0, Q8_0
        return kernels.gguf_x8_unpack(weight.data, weight.ggml_type), REPACKED[weight.ggml_type]
    return weight.data, weight.ggml_type


def step_of(kernels: Any, layers: list[dict[str, Any]], x: Any, xd: Any) -> Callable[[], None]:
    def step() -> None:
        for w in layers:
            qkv = [w["q_proj"], w["k_proj"], w["v_proj"]]
            kernels.gguf_linear_int8_n(x, [d for d, _ in qkv], [t for _, t in qkv], [None] * 3)
            kernels.gguf_linear_int8(x, *w["o_proj"], None)
            gate_up = [w["gate_proj"], w["up_proj"]]
            kernels.gguf_linear_int8_n(x, [d for d, _ in gate_up], [t for _, t in gate_up], [None] * 2)
            kernels.gguf_linear_int8(xd, *w["down_proj"], None)

    return step


def head_of(kernels: Any, weight: tuple[Any, int], x: Any) -> Callable[[], None]:
    return lambda: kernels.gguf_linear_int8(x, *weight, None)


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a GGUF file, or a preset with --gguf-type")
    parser.add_argument("--gguf-type", help="llama_cpp_peer.py's converted file of the preset (e.g. Q4_K_M)")
    parser.add_argument("--tokenizer", help="a tokenizer (or a preset's) for a GGUF file without one")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("TRAM_CPU_THREADS", str(args.threads))

    import torch

    from tram.bench.cpuinfo import cpu_summary
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    print(f"machine: {cpu_summary()}; torch threads {args.threads}")
    model = load(args)
    kernels = load_cpu_kernels()
    layers, head = weights(model)
    file = [{n: in_file_layout(kernels, w) for n, w in layer.items()} for layer in layers]
    repacked = [{n: (w.data, w.ggml_type) for n, w in layer.items()} for layer in layers]
    layouts = {"file": (file, in_file_layout(kernels, head)), "x8": (repacked, (head.data, head.ggml_type))}
    hidden, inner = layers[0]["q_proj"].in_features, layers[0]["down_proj"].in_features
    print(f"{len(layers)} layers, hidden {hidden}, MLP {inner}; LM head {tuple(head.data.shape)}")
    with torch.inference_mode():
        for rows in args.rows:
            x, xd = torch.randn(rows, hidden), torch.randn(rows, inner)
            for r in range(args.rounds):
                cells = []
                for part in ("layers", "head"):
                    ms = {}
                    for name, (ws, hw) in layouts.items():
                        fn = step_of(kernels, ws, x, xd) if part == "layers" else head_of(kernels, hw, x)
                        ms[name] = median_ms(fn, args.reps)
                    cells.append(f"{part} {ms['file']:.3f} -> {ms['x8']:.3f} ms ({ms['x8'] / ms['file']:.2f})")
                print(f"rows {rows:4d} round {r}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
