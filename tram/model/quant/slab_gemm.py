"""Many rows of x times a quantized weight through a library GEMM: the weight decoded to x's dtype a
slab of rows at a time, then F.linear (oneDNN / MKL), where that beats csrc/tiled_gemm.h.

Two cases, measured (docs/benchmarks.md):
  * bfloat16 x on CPUs whose oneDNN runs bf16 GEMMs natively (AMX, AVX512-BF16): with
    `--dtype bfloat16` a prefill's linears are compute-bound, and oneDNN's bf16 GEMM runs 3-6x faster
    than any float32 GEMM there, ours included ("bfloat16 activations for quantized weights").
  * float32 x with kernels built without AVX-512 (AVX2 CPUs such as AMD Zen 3): MKL's AVX2 SGEMM on the
    decoded float32 weight ran 1.14-1.42x faster than the tiled GEMM's AVX2 micro-kernel from 32 rows
    ("The C++ kernels on AVX2-only CPUs"); with AVX-512 the tiled GEMM is within a few percent of it.
Decoding a weight costs about one pass over its decoded bytes (and oneDNN may copy an unpacked weight
into its own layout once more), which only enough rows repay: from ~28 rows for a layer's weight of
one slab (MIN_ROWS), from ~100 for a weight of many slabs, the 152K-row LM head (MIN_ROWS_MANY_SLABS,
measured in bf16). Fewer rows keep the callers' kernels, as does bfloat16 x where bf16 GEMMs are not
native (PyTorch's bf16 F.linear is slower than float32 there).

Numerics: bf16 slabs are a bfloat16 checkpoint's (each weight rounded once to bfloat16, float32
accumulation inside oneDNN, the output rounded to bfloat16); float32 slabs hold exactly the weights the
kernels compute with, summed in MKL's order: what the float32 oracle (transformers on the dequantized
weights) computes. The library picks its blocking by shape, so a row's last bit can depend on the rows
computed with it, as with a float checkpoint's prefill through F.linear (cpu_packed.py); the C++
kernels keep their fixed order.

Slabs of at most SLAB_WEIGHTS weights bound the transient: the whole LM head of a 152K-token
vocabulary at hidden 896 would be 272 MB of bfloat16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

from tram.model.layers.cpu_packed import bf16_gemm_native

SLAB_WEIGHTS = 8 << 20  # 16 MB of bf16, 32 MB of float32: a 4864 x 896 MLP weight is one slab
MIN_ROWS = 32  # rows of x from which the slabs beat the tiled GEMM on a weight of one slab
MIN_ROWS_MANY_SLABS = 128  # the same for a weight of several slabs

# decode(n0, n1, out): rows n0 .. n1 - 1 of the weight into out [n1 - n0, K] (float32 or bfloat16)
Decode = Callable[[int, int, torch.Tensor], None]


@functools.cache
def bf16_gemm_fast() -> bool:
    """Whether bfloat16 x goes to slabs here (checked once: it asks oneDNN about the CPU)."""
    return bf16_gemm_native()


@functools.cache
def float32_gemm_faster(kernels: ModuleType) -> bool:
    """Whether float32 x goes to slabs: the C++ kernels were built without AVX-512 (asked once per
    build, not on every call)."""
    return kernels.vector_bits() < 512


def wants_slabs(x: torch.Tensor, out_features: int, in_features: int, kernels: ModuleType) -> bool:
    """Whether x's rows times a [out_features, in_features] weight go to slab_linear: a dtype whose
    library GEMM wins here, and enough rows to repay decoding the weight."""
    if x.device.type != "cpu":
        return False
    if x.dtype == torch.bfloat16:
        if not bf16_gemm_fast():
            return False
    elif x.dtype != torch.float32 or not float32_gemm_faster(kernels):
        return False
    one_slab = out_features * in_features <= SLAB_WEIGHTS
    return x.shape[0] >= (MIN_ROWS if one_slab else MIN_ROWS_MANY_SLABS)


def slab_linear(
    x: torch.Tensor, out_features: int, in_features: int, decode: Decode, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] @ W.T + bias with W decoded slab by slab in x's dtype; [M, out_features] in x's dtype."""
    rows = max(1, min(out_features, SLAB_WEIGHTS // in_features))
    outs = []
    for n0 in range(0, out_features, rows):
        n1 = min(out_features, n0 + rows)
        w = torch.empty(n1 - n0, in_features, dtype=x.dtype, device=x.device)
        decode(n0, n1, w)
        outs.append(F.linear(x, w, None if bias is None else bias[n0:n1]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
