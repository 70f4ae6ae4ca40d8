"""GPU benchmark of Tram on a Llama-3-8B-shaped model with dummy weights, in one command.

    python3 benchmarks/gpu_bench.py [--out results.json] [--sections decode,kernels,quant,throughput] [--smoke]

Sections (each runs in its own child process by default, so that a crash, a CUDA error or a timeout
in one loses nothing of the others; results are written to --out after every section):
  decode      engine step time of decode-only steps at batch 1/64/256 with 1,024 tokens of context,
              against the memory-bandwidth bound (weights + KV read once per step, over the measured
              device-to-device copy bandwidth).
  throughput  offline throughput, 1,000 requests x 1,024 random input / 128 output tokens, through
              `LLM.generate`, then transformers' continuous batching on the same prompts and model
              shape; plus the compute floor of the workload at the measured matmul rate.
  kernels     Tram's Triton kernels (write_kv_cache, paged_attention) against PyTorch SDPA on the
              equivalent dense problems, with a correctness check against a float32 reference.
  quant       Tram's Triton weight-only GEMMs (int8 per channel, int4 in groups of 128) against
              F.linear in --dtype on the model's linear shapes at 1/16/64/256 rows: time, weight
              bytes read over the copy bandwidth, and a check against the float32 dequantized
              reference.

--smoke runs everything on the CPU with tiny sizes (kernels under TRITON_INTERPRET=1) in well under a
minute; tests/bench/test_gpu_bench_smoke.py uses it. `--smoke --device cuda` runs the same tiny sizes
on the GPU (compiled kernels, CUDA graphs, events): a one-minute check of every GPU code path before a
full run. Progress goes to stderr, the summary table to stdout; the report records the host's CPU
and versions (tram.bench.report.machine_info) and the device.

The code lives in benchmarks/gpu/, one file per section (see its __init__.py); this file only sets
up the environment and starts it.
"""

from __future__ import annotations

import os
import sys

# The Triton interpreter is chosen when @triton.jit runs, i.e. when the kernels module is imported,
# so the variable must be set before anything imports triton (children inherit it). Not for
# `--smoke --device cuda`: tiny sizes on the GPU, compiled kernels, a quick check of the GPU paths.
if "--smoke" in sys.argv and not {"cuda", "--device=cuda"} & set(sys.argv):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _checkout  # noqa: E402, F401  (this checkout's tram first on sys.path)
from gpu.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
