"""Two builds of Tram's C++ kernels on every kernel family, side by side, each in a process of its own.

    python benchmarks/kernel_ab_suite.py BEFORE AFTER [--repeats 15] [--threads 2]

BEFORE and AFTER: folders that `TORCH_EXTENSIONS_DIR=FOLDER tram build-kernels` filled (kernel_ab.py's
load_build), or a `.so` holding every kernel named below (a build from before the kernel families).

kernel_ab.py times the GGUF int8 linear and the fused MoE kernel in depth; this times one call of
each of the others on the llama-110m shapes (hidden 768, 12 heads of 64, MLP 2048, bfloat16 unless
named) for a change that touches every file at once, such as the compiler's flags. The calls of
the two builds take turns (each in a process of its own, see _worker), each sample the mean of a
burst of calls, and the table reports the median over `--repeats` pairs, so that a VM's drift slows
both builds alike. The outputs column says whether the two agree bit for bit: the compiler may
vectorise an `omp simd` reduction differently under other flags, which moves a float32 sum by an ulp
(the kernels' tests hold each build to its reference and to batch invariance).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch
from kernel_ab import Q4_K, load_build, random_blocks

from tram.bench.report import machine_summary

Call = Callable[[Any], object]
BF16 = torch.bfloat16


def _decode_case(batch: int, context: int, dtype: torch.dtype) -> Call:
    heads, dim, block = 12, 64, 16
    blocks_each = context // block
    kv = torch.randn(2, batch * blocks_each, block, heads, dim).to(dtype)
    q = torch.randn(batch, heads, dim).to(dtype)
    tables = torch.arange(batch * blocks_each, dtype=torch.int32).view(batch, blocks_each)
    lens = torch.full((batch,), context, dtype=torch.int32)
    return lambda m: m.paged_decode_attention(q, kv, tables, lens, dim**-0.5, 0, 1.0, 1.0, 0.0, None)


def _prefill_case(tokens: int) -> Call:
    heads, dim, block = 12, 64, 16
    kv = torch.randn(2, tokens // block, block, heads, dim).to(BF16)
    q = torch.randn(tokens, heads, dim).to(BF16)
    out = torch.empty_like(q)
    tables = torch.arange(tokens // block, dtype=torch.int32).view(1, -1)

    def run(m: Any) -> torch.Tensor:
        m.paged_prefill_attention_(out, q, kv, tables, [0], [tokens], [tokens], dim**-0.5, 0, 1.0, 1.0, 0.0, None)
        return out.clone()

    return run


def _rotary_case(tokens: int) -> Call:
    q, k = torch.randn(tokens, 12, 64).to(BF16), torch.randn(tokens, 12, 64).to(BF16)
    angle = torch.rand(tokens, 64)
    cos, sin = angle.cos().to(BF16), angle.sin().to(BF16)

    def run(m: Any) -> torch.Tensor:
        qq, kk = q.clone(), k.clone()
        m.rotary_(qq, kk, cos, sin)
        return torch.cat([qq, kk])

    return run


def _pair_case(rows: int, n: int, k: int) -> Call:
    x, w = torch.randn(rows, k).to(BF16), (torch.randn(n, k) / k**0.5).to(BF16)
    packed: dict[int, torch.Tensor] = {}

    def run(m: Any) -> torch.Tensor:
        p = packed.setdefault(id(m), m.pair_pack(w))
        return m.pair_linear(x, p, n, None)

    return run


def _quant_cases(rows: int, n: int, k: int) -> dict[str, Call]:
    x = torch.randn(rows, k)
    x64 = x.repeat(64 // rows, 1)
    q8, s8 = torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n) * 1e-2
    q4, s4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8), torch.rand(n, k // 128) * 1e-2
    return {
        f"quant_linear int8 [{rows},{k}]x[{n},{k}] f32": lambda m: m.quant_linear(x, q8, s8, 0, None, None),
        f"quant_linear int4 [{rows},{k}]x[{n},{k}] f32": lambda m: m.quant_linear(x, q4, s4, 128, None, None),
        f"quant_gemm int4 [64,{k}]x[{n},{k}] f32": lambda m: m.quant_gemm(x64, q4, s4, 128, None, None),
    }


def cases() -> dict[str, Call]:
    h = torch.randn(16, 768).to(BF16)
    big = torch.randn(512, 768).to(BF16)
    norm_w = torch.rand(768).to(BF16)
    gate_up = torch.randn(16, 4096).to(BF16)
    logits = torch.randn(16, 32000)
    w_skinny = torch.randn(2304, 768) / 768**0.5
    x4 = torch.randn(4, 768)
    q4k = random_blocks(Q4_K, 2048, 2048)
    xg = torch.randn(4, 2048)
    table: dict[str, Call] = {
        "paged_decode_attention bf16 B16 ctx256": _decode_case(16, 256, BF16),
        "paged_decode_attention f32 B64 ctx256": _decode_case(64, 256, torch.float32),
        "paged_prefill_attention_ bf16 512 tokens": _prefill_case(512),
        "rms_norm [16,768]": lambda m: m.rms_norm(h, norm_w, 1e-6),
        "add_rms_norm [512,768]": lambda m: m.add_rms_norm(big, big, norm_w, 1e-6),
        "rotary_ [16,12,64]": _rotary_case(16),
        "silu_and_mul [16,4096]": lambda m: m.silu_and_mul(gate_up),
        "pair_linear [16,768]x[2304,768]": _pair_case(16, 2304, 768),
        "skinny_linear f32 [4,768]x[2304,768]": lambda m: m.skinny_linear(x4, w_skinny, None),
        **_quant_cases(4, 2304, 768),
        "gguf_linear Q4_K [4,2048]x[2048,2048] f32": lambda m: m.gguf_linear(xg, q4k, Q4_K, None),
        "gguf_gemm Q4_K [64,2048]x[2048,2048] f32": lambda m: m.gguf_gemm(xg.repeat(16, 1), q4k, Q4_K, None),
        "argmax_rows f32 [16,32000]": lambda m: m.argmax_rows(logits),
    }
    return table


def _sample(call: Call, module: Any, burst: int) -> float:
    start = time.perf_counter()
    for _ in range(burst):
        call(module)
    return (time.perf_counter() - start) / burst * 1e6


def _worker(path: str, threads: int, conn: Connection) -> None:
    """One build in a process of its own: two builds in one process share their GNU-unique symbols
    (an inline function's static, such as a kernel's table of function pointers), so the second
    build would run some of the first one's code."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)  # the same inputs in both processes
    module, table = load_build(path), cases()
    while (request := conn.recv()) is not None:
        name, burst = request
        call = table[name]
        if burst == 0:
            conn.send(call(module))
        else:
            call(module)  # the OpenMP threads awake, the caches warm, before the timed burst
            conn.send(_sample(call, module, burst))


def _outputs_agree(a: object, b: object) -> bool:
    if isinstance(a, (tuple, list)):
        return all(_outputs_agree(x, y) for x, y in zip(a, b, strict=True))
    return bool(torch.equal(a, b)) if isinstance(a, torch.Tensor) else a == b


def _compare(conns: list[Connection], name: str, repeats: int) -> tuple[float, float, bool]:
    outputs = []
    for conn in conns:
        conn.send((name, 0))
        outputs.append(conn.recv())
    conns[0].send((name, 10))  # warm: a first call after a pause also wakes the OpenMP threads
    once = max(conns[0].recv(), 1.0)
    burst = max(10, min(500, int(20_000 / once)))  # about 20 ms a sample: timer and scheduling noise stay small
    times: list[list[float]] = [[], []]
    for _ in range(repeats):
        for i, conn in enumerate(conns):
            conn.send((name, burst))
            times[i].append(conn.recv())
    return statistics.median(times[0]), statistics.median(times[1]), _outputs_agree(*outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe() for _ in range(2)]
    workers = [
        context.Process(target=_worker, args=(path, args.threads, child), daemon=True)
        for path, (_, child) in zip((args.before, args.after), pipes, strict=True)
    ]
    for worker in workers:
        worker.start()
    conns = [parent for parent, _ in pipes]
    print(machine_summary())
    print("| kernel | before µs | after µs | after / before | outputs |")
    print("|---|---|---|---|---|")
    ratios = []
    torch.manual_seed(0)
    for name in cases():
        before, after, agree = _compare(conns, name, args.repeats)
        ratios.append(after / before)
        print(f"| {name} | {before:,.1f} | {after:,.1f} | {after / before:.2f} | {'equal' if agree else 'differ'} |")
    for conn in conns:
        conn.send(None)
    geo = statistics.geometric_mean(ratios)
    print(f"\ngeometric mean after / before over {len(ratios)} kernels: {geo:.3f}")


if __name__ == "__main__":
    main()
