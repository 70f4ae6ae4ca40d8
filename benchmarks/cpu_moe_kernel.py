"""Micro-benchmark: a mixture-of-experts layer's experts on CPU, the fused kernel (csrc/fused_moe.cpp)
vs the grouped PyTorch reference (per expert: gather its tokens, two matmuls, activation, index_add).

The layer is Qwen3-30B-A3B's (hidden 2048, 128 experts, top-8, expert intermediate 768), routed at
random. GB/s counts the expert weight bytes the call must read: those of the experts its tokens chose
(scales included). Each time is the best of --repeats loops of --calls calls (the machine may be
shared). The reference runs on the bfloat16 weights for bf16 and int4 (PyTorch has no int4 GEMM of
this layout on CPU), so for int4 it is the float baseline the quantized kernel replaces. For `awq`
(int4 with a zero point per group of 128, as AWQ and asymmetric GPTQ checkpoints hold experts) the
reference is the path such experts took before the kernel took zero points: the grouped path, expert
by expert on the quantized linear kernels (csrc/quant_linear.cpp).

    python benchmarks/cpu_moe_kernel.py [--tokens 1 16 64 512] [--formats bf16 int4 awq] [--threads N] [--quick]
        [--vllm-python PATH]

--vllm-python adds vLLM's CPU kernel on the same bf16 inputs (vllm_moe_kernel.py, run in vLLM's own
virtual environment with the thread settings `tram bench throughput --backend vllm` gives it): its ms
per call and vLLM / kernel, the kernel's speed-up over it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch
import torch.nn.functional as F

from tram.bench.report import machine_summary
from tram.bench.timing import best_ms
from tram.bench.vllm_peer import check_python, vllm_env
from tram.model.kernels.cpu_kernels import load_cpu_kernels
from tram.model.layers.moe.cpu_kernel import cpu_fused_moe
from tram.model.layers.moe.experts import ExpertWeights
from tram.model.layers.moe.reference import grouped_moe
from tram.model.quant.checkpoint_weight import CheckpointInt4Weight
from tram.model.quant.weights import Int4Weight, unpack_int4

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8


def cpu_lines() -> str:
    """lscpu's model name and ISA flags (the vector extensions only)."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = [f for f in fields.get("Flags", "").split() if f.startswith(("avx", "fma", "amx", "f16c"))]
    return f"cpu: {fields.get('Model name', '?').strip()}; ISA: {' '.join(flags)}"


def reference(x, ids, weights, w13, w2) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in ids.unique().tolist():
        if e < 0:
            continue
        t, j = (ids == e).nonzero(as_tuple=True)
        gate, up = F.linear(x[t], w13[e]).float().chunk(2, dim=-1)
        y = F.linear((F.silu(gate) * up).to(x.dtype), w2[e]).float()
        out.index_add_(0, t, y * weights[t, j, None])
    return out.to(x.dtype)


def int4_format(w: torch.Tensor, group: int = 128) -> ExpertWeights:
    per = [Int4Weight(w[e].float(), group) for e in range(w.shape[0])]
    data = torch.stack([p.qweight for p in per])
    scale = torch.stack([p.scale for p in per])
    return ExpertWeights("int4", data, w.shape[1], w.shape[2], scale=scale, group=group)


def awq_format(w: torch.Tensor, group: int = 128) -> ExpertWeights:
    """int4 with random zero points per group (an AWQ checkpoint's layout after loading)."""
    g = torch.Generator().manual_seed(w.shape[1])
    per = []
    for e in range(w.shape[0]):
        base = Int4Weight(w[e].float(), group)
        zero = torch.randint(0, 16, base.scale.shape, generator=g).to(torch.uint8)
        per.append(CheckpointInt4Weight(unpack_int4(base.qweight), base.scale, group, zero))
    stack = {f: torch.stack([getattr(p, f) for p in per]) for f in ("qweight", "scale", "zero")}
    return ExpertWeights("int4", stack["qweight"], w.shape[1], w.shape[2], stack["scale"], stack["zero"], group)


def expert_bytes(fmt: ExpertWeights) -> int:
    """Bytes of one expert's weight (and scales, zero points)."""
    per = fmt.data[0].numel() * fmt.data.element_size()
    return per + sum(0 if t is None else t[0].numel() * t.element_size() for t in (fmt.scale, fmt.zero))


def vllm_times(python: str, w13: torch.Tensor, w2: torch.Tensor, cases: list[dict], threads: int) -> dict:
    """vLLM's kernel on the same inputs, in its own environment: {"ms": {tokens: ms}, "isa": ...}."""
    check_python(python)
    script = Path(__file__).with_name("vllm_moe_kernel.py")
    with tempfile.TemporaryDirectory(prefix="tram-vllm-moe-") as tmp:
        inputs, result = Path(tmp) / "inputs.pt", Path(tmp) / "result.json"
        torch.save({"w13": w13, "w2": w2, "cases": cases}, inputs)
        env = {**os.environ, **vllm_env(python, threads, 1)}
        proc = subprocess.run([python, str(script), str(inputs), str(result)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"vLLM's kernel failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return json.loads(result.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 512])
    p.add_argument("--formats", nargs="+", default=["bf16", "int4"], choices=["bf16", "int4", "awq"])
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    p.add_argument("--quick", action="store_true", help="fewer calls (1 repeat of 3; 1 call from 512 tokens)")
    p.add_argument("--vllm-python", help="also time vLLM's CPU kernel (bf16) with this Python (its own venv)")
    args = p.parse_args()
    assert load_cpu_kernels() is not None, "the CPU kernels failed to build"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(cpu_lines())
    print(machine_summary() + "\n")
    g = torch.Generator().manual_seed(0)
    w13 = torch.stack([(torch.randn(2 * INTER, HIDDEN, generator=g) * 0.02).bfloat16() for _ in range(EXPERTS)])
    w2 = torch.stack([(torch.randn(HIDDEN, INTER, generator=g) * 0.02).bfloat16() for _ in range(EXPERTS)])
    formats = {"bf16": (ExpertWeights("float", w13, 2 * INTER, HIDDEN), ExpertWeights("float", w2, HIDDEN, INTER))}
    if "int4" in args.formats:
        formats["int4"] = (int4_format(w13), int4_format(w2))
    if "awq" in args.formats:
        formats["awq"] = (awq_format(w13), awq_format(w2))
    rows, cases = [], []
    for name in args.formats:
        f13, f2 = formats[name]
        for T in args.tokens:
            x = torch.randn(T, HIDDEN, generator=g).bfloat16()
            weights, ids = torch.randn(T, EXPERTS, generator=g).softmax(-1).topk(TOP_K, dim=-1)
            ids = ids.to(torch.int32)
            calls, repeats = (1 if T >= 512 else 3, 1) if args.quick else (args.calls, args.repeats)
            with torch.inference_mode():
                ours = best_ms(lambda: cpu_fused_moe(x, ids, weights, f13, f2, None, None, "silu"), repeats, calls)
                if name == "awq":  # the per-expert checkpoint weights, as the grouped path ran them
                    m13, m2 = (ExpertWeights.of_modules(f.views(), f.out_features, f.in_features) for f in (f13, f2))
                    ref = best_ms(lambda: grouped_moe(x, ids, weights, m13, m2, None, None, "silu"), repeats, calls)
                else:
                    ref = best_ms(lambda: reference(x, ids, weights, w13, w2), repeats, calls)
            active = ids.unique().numel()
            gbps = active * (expert_bytes(f13) + expert_bytes(f2)) / ours / 1e6
            rows.append((name, T, active, ours, gbps, ref))
            if name == "bf16":
                case = {"x": x, "topk_ids": ids, "topk_weights": weights, "calls": calls, "repeats": repeats}
                cases.append(case)
    peer = None
    if args.vllm_python and cases:
        peer = vllm_times(args.vllm_python, w13, w2, cases, torch.get_num_threads())
        print(f"vLLM {peer['vllm_version']}: cpu_fused_moe, isa {peer['isa']}, {peer['threads']} threads\n")
    head = "| weights | tokens | active experts | kernel ms | kernel GB/s | reference ms | speed-up |"
    print(head + (" vLLM ms | **vLLM / kernel** |" if peer else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|" if peer else ""))
    for name, T, active, ours, gbps, ref in rows:
        line = f"| {name} | {T} | {active} | {ours:.3f} | {gbps:.1f} | {ref:.3f} | {ref / ours:.2f}x |"
        if peer:
            theirs = peer["ms"].get(str(T)) if name == "bf16" else None
            line += f" {theirs:.3f} | **{theirs / ours:.2f}x** |" if theirs else " | |"
        print(line)


if __name__ == "__main__":
    main()
