"""The command line of benchmarks/gpu_bench.py: flags, --smoke's defaults, and main()."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gpu.common import log, preset_choices  # isort: skip (this folder, on sys.path when gpu_bench.py runs)
from gpu.sections import SECTION_NAMES, run_all, run_child  # isort: skip
from gpu.summary import print_report  # isort: skip

DESCRIPTION = "GPU benchmark of Tram on a Llama-3-8B-shaped model with dummy weights, in one command."
# --smoke replaces these defaults (flags given explicitly still win).
SMOKE_DEFAULTS: dict[str, Any] = dict(
    preset="tiny",
    device="cpu",
    decode_batches="1,4",
    context=48,
    decode_steps=3,
    decode_warmup=1,
    profile_batches="4",
    num_requests=6,
    input_len=24,
    output_len=6,
    hf_num_blocks=64,
    hf_max_batch_tokens=256,
    kernel_batches="1,2",
    kernel_context=64,
    kernel_splits="1,2",
    prefill_len=64,
    chunk_prefix=32,
    chunk_len=32,
    kernel_warmup=0,
    kernel_iters=1,
    copy_mib=32,
    matmul_n=256,
    quant_rows="1,17",
    quant_shapes="64x128,64x256",
    section_timeouts="decode=120,kernels=120,quant=120,throughput=120",
    hf_timeout=60,
)


def default_out() -> Path:
    # On the lent device machine $OUT is the folder whose files come back.
    return Path(os.environ["OUT"]) / "gpu_bench.json" if os.environ.get("OUT") else Path("gpu_bench_results.json")


def add_common_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--out", type=Path, default=None, help="JSON report (default $OUT/gpu_bench.json or ./gpu_bench_results.json)")
    a("--sections", default=",".join(SECTION_NAMES), help="comma-separated subset of " + ",".join(SECTION_NAMES))
    a("--smoke", action="store_true", help="tiny sizes on the CPU, kernels under TRITON_INTERPRET=1")
    a("--device", default="auto", choices=["auto", "cuda", "cpu"])
    a(
        "--preset",
        default="llama-3-8b",
        choices=preset_choices(),
        help="a tram.bench preset (dummy weights); 'tiny' is --smoke's model",
    )
    a("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    a("--seed", type=int, default=0)
    a("--block-size", type=int, default=16)
    a("--attention-backend", default=None, help="Tram attention backend (default: the engine's)")
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--max-num-seqs", type=int, default=256, help="throughput section's Tram max_num_seqs")
    a("--max-num-batched-tokens", type=int, default=None)
    a("--enforce-eager", action="store_true", help="Tram without CUDA graphs")


def add_decode_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decode")
    g.add_argument("--decode-batches", default="1,64,256")
    g.add_argument("--context", type=int, default=1024, help="prompt tokens per sequence before decoding")
    g.add_argument("--decode-steps", type=int, default=20, help="measured decode steps per batch (median)")
    g.add_argument("--decode-warmup", type=int, default=3)
    g.add_argument("--copy-mib", type=int, default=2048, help="size of the bandwidth-measuring copy")
    g.add_argument(
        "--profile-batches",
        default="1,256",
        help="batches whose decode steps are also profiled (top kernels, device busy time; '' for none)",
    )


def add_throughput_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("throughput")
    g.add_argument("--num-requests", type=int, default=1000)
    g.add_argument("--input-len", type=int, default=1024)
    g.add_argument("--output-len", type=int, default=128)
    g.add_argument("--hf-num-requests", type=int, default=None, help="default: --num-requests")
    g.add_argument(
        "--hf-attn",
        default="sdpa",
        help="transformers attn_implementation ('paged|sdpa' is "
        "deprecated in transformers 5 and means the same under continuous batching)",
    )
    g.add_argument("--hf-timeout", type=float, default=150.0, help="seconds; then finished requests only count")
    g.add_argument("--hf-num-blocks", type=int, default=None)
    g.add_argument("--hf-max-batch-tokens", type=int, default=None)
    g.add_argument("--skip-hf", action="store_true")
    g.add_argument("--matmul-n", type=int, default=8192)


def add_kernel_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kernels")
    g.add_argument("--kernel-batches", default="1,64,256")
    g.add_argument("--kernel-context", type=int, default=1024)
    g.add_argument("--kernel-splits", default="1,8", help="num_splits values timed at every decode batch")
    g.add_argument("--prefill-len", type=int, default=1024)
    g.add_argument("--chunk-prefix", type=int, default=512)
    g.add_argument("--chunk-len", type=int, default=512)
    g.add_argument("--kernel-warmup", type=int, default=3, help="CPU timing only (CUDA uses do_bench); also quant's")
    g.add_argument("--kernel-iters", type=int, default=20, help="CPU timing only (CUDA uses do_bench); also quant's")


def add_quant_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("quant")
    g.add_argument("--quant-rows", default="1,16,64,256", help="rows of x (tokens) at every shape")
    g.add_argument(
        "--quant-shapes", default="", help="'NxK,...' (out x in features) instead of the preset's linear shapes"
    )


def add_running_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("running")
    g.add_argument(
        "--section-timeouts",
        default="decode=150,kernels=120,quant=120,throughput=290",
        help="seconds per section child process",
    )
    g.add_argument("--no-isolate", action="store_true", help="run sections in this process")
    g.add_argument("--child-section", help=argparse.SUPPRESS)
    g.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    g.add_argument("--child-deadline", type=float, default=None, help=argparse.SUPPRESS)  # epoch seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_bench.py", description=DESCRIPTION)
    for add in (
        add_common_flags,
        add_decode_flags,
        add_throughput_flags,
        add_kernel_flags,
        add_quant_flags,
        add_running_flags,
    ):
        add(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if "--smoke" in argv:
        parser.set_defaults(**SMOKE_DEFAULTS)
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTION_NAMES))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTION_NAMES)}")
    args.timeouts = {k: float(v) for k, v in (kv.split("=") for kv in args.section_timeouts.split(",") if kv)}
    args.out = args.out or default_out()
    return args


def main() -> int:
    args = parse_args()
    if args.child_section:
        run_child(args)
        return 0
    report = run_all(args)
    print_report(report)
    log(f"wrote {args.out}")
    return 0 if all(e["status"] == "ok" for e in report["sections"].values()) else 1
