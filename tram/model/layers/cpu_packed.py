"""oneDNN-packed weights for the CPU linear layers (vLLM's CPU backend packs them the same way).

Why: PyTorch's float32 `F.linear` goes to MKL's sgemm on nn.Linear's [N, K] layout, which on the
shapes of a decode or mixed step runs well below oneDNN's inner product on a weight reordered once
into its blocked layout, in float32 and more so in bfloat16 with AVX512-BF16, with or without
AVX-512 (docs/benchmarks.md, "oneDNN-packed linear weights", has the GFLOP/s). The reorder happens
once, after loading; the packed copy lives beside the plain weight, which the skinny kernel (one or
two rows), the embedding (a tied LM head) and everything that reads `weight` keep using.

A weight is packed when torch was built with oneDNN and the dtype is float32 or bfloat16.
TRAM_CPU_PACKED_LINEAR=0 switches packing off.

A bfloat16 weight that is multiplied by few rows per call (an LM head: one row per sequence of a step)
is packed in pairs of k for csrc/pair_linear.cpp instead, where the kernels prefer that (AVX512-BF16
without AMX): there oneDNN reaches 70% of the bf16 peak at 16 rows and reads W below the memory's
speed at 1-8, where pair_linear streams W at it and takes every row count (docs/benchmarks.md, "The
LM head's decode batch on pairs of k"). It replaces the oneDNN copy, so memory is the same.

The layers' bfloat16 weights keep oneDNN's copy (pairs took 1.03-1.20x its time at a prefill's 64-512 rows) and,
where the kernels prefer pairs and the copies are small beside the machine's memory (at most
TRAM_CPU_PAIR_COPIES of it, 1/16 by default: a small model's copies cost the KV cache little), get a
pairs copy as well for a decode step's rows: a 768-wide layer's weights, read cold as a decode step
reads them, ran 4-32 rows in 0.71-0.87 of oneDNN's time (docs/benchmarks.md, "The decode batch's
linears on pairs of k"). TRAM_CPU_PAIR_LINEAR=0 keeps oneDNN's layout for both.

bfloat16 on a CPU without bf16 instructions (AVX2 machines such as AMD Zen 3): oneDNN refuses to
reorder bf16 there, and PyTorch's bf16 `F.linear` converts element by element, several times
slower than float32. The packed copy is then float32 (the bf16 values exactly), the few
activations are widened and the result rounded once to bfloat16 -- the rounding a bf16 GEMM with
float32 accumulation makes. It costs twice the bf16 weight's memory beside it; the log says how much.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

import tram.envs as envs
from tram.model.kernels.cpu_kernels import load_cpu_kernels

logger = logging.getLogger(__name__)

ENV_SWITCH = "TRAM_CPU_PACKED_LINEAR"
PACKED_DTYPES = (torch.float32, torch.bfloat16)


class PairPacked(NamedTuple):
    """A bfloat16 weight [N, K] packed in pairs of k for csrc/pair_linear.cpp."""

    data: torch.Tensor  # [ceil(N / 16), ceil(K / 2), 16] int32
    out_features: int


class DecodePairs(NamedTuple):
    """A bfloat16 weight packed twice: in pairs of k for a decode step's rows (up to PAIR_ROWS), in
    oneDNN's layout past them."""

    onednn: torch.Tensor
    pairs: PairPacked


# Most rows of x the pairs copy beside oneDNN's takes: at 32 rows it ran in 0.87 of oneDNN's time, at 48
# in 0.92, at 64 in 0.95 (cold weights, llama-110m's shapes).
PAIR_ROWS = 48

PackFn = Callable[[torch.Tensor], "torch.Tensor | DecodePairs | None"]
# The batch size oneDNN picks the blocked layout for (vLLM's choice too); any row count runs on it.
_LAYOUT_ROWS = 32


def packing_enabled() -> bool:
    return envs.TRAM_CPU_PACKED_LINEAR and torch.backends.mkldnn.is_available()


def bf16_gemm_native() -> bool:
    """Whether oneDNN runs bfloat16 GEMMs in bf16 here (AVX512-BF16, AMX or AVX-NE-CONVERT)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [N, K] reordered into oneDNN's blocked layout (float32 for a bf16 weight on a CPU
    without bf16 GEMMs), or None where oneDNN cannot run it."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES or weight.dim() != 2:
        return None
    weight = weight.detach().contiguous()
    if weight.dtype == torch.bfloat16 and not bf16_gemm_native():
        weight = weight.float()
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, _LAYOUT_ROWS)
    except RuntimeError as exc:
        logger.debug("not packing a %s %s weight for oneDNN: %s", weight.dtype, tuple(weight.shape), exc)
        return None


def _pairs_preferred(weight: torch.Tensor) -> bool:
    """Whether a weight may be packed in pairs of k here: bfloat16 on the CPU, where the kernels prefer it."""
    if not (envs.TRAM_CPU_PAIR_LINEAR and weight.device.type == "cpu" and weight.dtype == torch.bfloat16):
        return False
    kernels = load_cpu_kernels()
    return weight.dim() == 2 and kernels is not None and kernels.pair_linear_preferred()


def pack_with_pairs(weight: torch.Tensor) -> torch.Tensor | DecodePairs | None:
    """pack_weight, plus a pairs copy for a decode step's rows where the kernels prefer pairs."""
    packed = pack_weight(weight)
    if packed is None or packed.dtype != torch.bfloat16 or not _pairs_preferred(weight):
        return packed
    kernels = load_cpu_kernels()
    return DecodePairs(packed, PairPacked(kernels.pair_pack(weight.detach()), weight.shape[0]))


def pack_few_rows(weight: torch.Tensor) -> torch.Tensor | PairPacked | None:
    """pack_weight for a weight multiplied by few rows of x per call (an LM head): a bfloat16 one in
    pairs of k where the kernels prefer that, else oneDNN's layout."""
    if _pairs_preferred(weight):
        return PairPacked(load_cpu_kernels().pair_pack(weight.detach()), weight.shape[0])
    return pack_weight(weight)


def packed_bytes(packed: torch.Tensor | PairPacked | DecodePairs) -> int:
    if isinstance(packed, DecodePairs):
        return packed_bytes(packed.onednn) + packed_bytes(packed.pairs)
    data = packed.data if isinstance(packed, PairPacked) else packed
    return data.numel() * data.element_size()


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor | PairPacked | DecodePairs, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] @ weight.T + bias through oneDNN's inner product on the packed weight (or pair_linear
    on a PairPacked one, or on a DecodePairs' pairs up to PAIR_ROWS rows); a float32 copy of a bf16
    weight computes in float32 and rounds the result to x's dtype once."""
    if isinstance(packed, DecodePairs):
        packed = packed.pairs if x.shape[0] <= PAIR_ROWS else packed.onednn
    if isinstance(packed, PairPacked):
        kernels = load_cpu_kernels()
        assert kernels is not None, "a PairPacked weight exists only where the kernels loaded"
        return kernels.pair_linear(x, packed.data, packed.out_features, bias)
    if packed.dtype == x.dtype:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    wide_bias = None if bias is None else bias.float()
    return torch.ops.mkldnn._linear_pointwise(x.float(), packed, wide_bias, "none", [], "").to(x.dtype)


def pack_cpu_linears(model: nn.Module) -> int:
    """Pack the weight of every module that has a `packed_weight` slot (Linear, LMHead); returns how
    many were packed. A no-op off the CPU or where packing is switched off."""
    if not packing_enabled():
        return 0
    start = time.perf_counter()
    pack = pack_with_pairs if _pairs_copies_fit(model) else pack_weight
    packed = extra = pairs = 0
    # A module with `pack_stacked` (the gated MLP's gate and up, attention's q, k and v) packs several of
    # its linears as one weight; those then get no copy of their own (one GEMM runs them all past the
    # skinny kernel's rows).
    stacked: set[int] = set()
    for module in model.modules():
        if hasattr(module, "pack_stacked"):
            packed_stack = module.pack_stacked(pack)
            if packed_stack is not None:
                packed += 1
                pairs += isinstance(packed_stack, DecodePairs)
                extra += packed_bytes(packed_stack)
                stacked.update(id(linear) for linear in module.stacked_linears())
    for module in model.modules():
        if not hasattr(module, "packed_weight") or id(module) in stacked:
            continue
        weight = _tied_embedding(model) if getattr(module, "tied", False) else module.weight
        if weight is None:
            module.packed_weight = None
            continue
        module.packed_weight = (pack_few_rows if getattr(module, "few_rows", False) else pack)(weight)
        if module.packed_weight is not None:
            packed += 1
            pairs += isinstance(module.packed_weight, (PairPacked, DecodePairs))
            extra += packed_bytes(module.packed_weight)
    if packed:
        logger.info(
            "Packed %d linear weights for oneDNN or in pairs of k (%d with pairs) in %.2f s (%.0f MiB beside "
            "the plain weights)",
            packed,
            pairs,
            time.perf_counter() - start,
            extra / 2**20,
        )
    return packed


def _pairs_copies_fit(model: nn.Module) -> bool:
    """Whether the layers' bfloat16 weights may keep a pairs copy beside oneDNN's: all of them together
    at most TRAM_CPU_PAIR_COPIES of physical memory (the LM head's few rows take pairs alone anyway)."""
    weights = [
        getattr(m, "weight", None)
        for m in model.modules()
        if hasattr(m, "packed_weight") and not getattr(m, "few_rows", False) and getattr(m, "quant", None) is None
    ]
    bf16 = [w for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == torch.bfloat16]
    if not bf16 or not _pairs_preferred(bf16[0]):
        return False
    total = sum(w.numel() * w.element_size() for w in bf16)
    return total <= envs.TRAM_CPU_PAIR_COPIES * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _tied_embedding(model: nn.Module) -> torch.Tensor | None:
    """The input embedding's weight, which a tied LM head multiplies by (CausalLM's `model.embed_tokens`)."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    return None if embed is None else embed.weight
