"""Many rows of bfloat16 x times a quantized weight, on CPUs whose oneDNN runs bf16 GEMMs natively
(AMX, AVX512-BF16): the weight decoded to bfloat16 a slab of rows at a time, then oneDNN's GEMM.

Why: with `--dtype bfloat16` a prefill's linears are compute-bound, and oneDNN's bf16 GEMM (AMX
tiles) runs 3-6x faster than any float32 GEMM on such CPUs, ours (csrc/tiled_gemm.h) included.
Decoding a weight costs about one pass over its bf16 bytes (and oneDNN may copy an unpacked
weight into its own layout once more), which only enough rows repay: measured on the 0.5B preset's
layers from ~28 rows (MIN_ROWS), and from ~100 for a weight of many slabs, the 152K-row LM head
(docs/benchmarks.md, "bfloat16 activations for quantized weights"). Fewer rows keep the callers' float32 tiled GEMM, as
do CPUs without native bf16 GEMMs (AVX2 ones such as AMD Zen 3), where PyTorch's bf16 F.linear is
slower than float32.

Numerics are a bfloat16 checkpoint's: each weight rounded once to bfloat16, float32 accumulation
inside oneDNN, the output rounded to bfloat16. oneDNN picks its blocking by shape, so a row's last
bit can depend on the rows computed with it, as with a bf16 checkpoint's oneDNN-packed linears
(cpu_packed.py); the float32 paths keep their fixed order.

Slabs of at most SLAB_BYTES bound the transient: the whole LM head of a 152K-token vocabulary at
hidden 896 would be 272 MB of bfloat16.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tram.model.cpu_packed import bf16_gemm_native

SLAB_BYTES = 16 << 20  # a 4864 x 896 MLP weight (8.7 MB) is one slab
MIN_ROWS = 32  # rows of x from which the slabs beat the float32 tiled GEMM on a weight of one slab
MIN_ROWS_MANY_SLABS = 128  # the same for a weight of several slabs

# decode(n0, n1, out): rows n0 .. n1 - 1 of the weight into out [n1 - n0, K] bfloat16
Decode = Callable[[int, int, torch.Tensor], None]


@functools.cache
def bf16_gemm_fast() -> bool:
    """Whether the many-row bf16 path applies here (checked once: it asks oneDNN about the CPU)."""
    return bf16_gemm_native()


def wants_bf16_slabs(x: torch.Tensor, out_features: int, in_features: int) -> bool:
    """Whether x's rows times a [out_features, in_features] weight go to bf16_slab_linear: bfloat16 x
    on a CPU with native bf16 GEMMs, and enough rows to repay decoding the weight."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or not bf16_gemm_fast():
        return False
    one_slab = out_features * in_features * 2 <= SLAB_BYTES
    return x.shape[0] >= (MIN_ROWS if one_slab else MIN_ROWS_MANY_SLABS)


def bf16_slab_linear(x: torch.Tensor, out_features: int, in_features: int, decode: Decode,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] bfloat16 @ W.T + bias with W decoded slab by slab; [M, out_features] bfloat16."""
    rows = max(1, min(out_features, SLAB_BYTES // (2 * in_features)))
    outs = []
    for n0 in range(0, out_features, rows):
        n1 = min(out_features, n0 + rows)
        w = torch.empty(n1 - n0, in_features, dtype=torch.bfloat16, device=x.device)
        decode(n0, n1, w)
        outs.append(F.linear(x, w, None if bias is None else bias[n0:n1]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
