"""oneDNN-packed weights for the CPU linear layers (vLLM's CPU backend packs them the same way).

Why: PyTorch's float32 `F.linear` goes to MKL's sgemm on nn.Linear's [N, K] layout, which on the
shapes of a decode or mixed step runs well below oneDNN's inner product on a weight reordered once
into its blocked layout, in float32 and more so in bfloat16 with AVX512-BF16, with or without
AVX-512 (docs/benchmarks.md, "oneDNN-packed linear weights", has the GFLOP/s). The reorder happens
once, after loading; the packed copy lives beside the plain weight, which the skinny kernel (one or
two rows), the embedding (a tied LM head) and everything that reads `weight` keep using.

A weight is packed when torch was built with oneDNN and the dtype is float32 or bfloat16.
TRAM_CPU_PACKED_LINEAR=0 switches packing off.

bfloat16 on a CPU without bf16 instructions (AVX2 machines such as AMD Zen 3): oneDNN refuses to
reorder bf16 there, and PyTorch's bf16 `F.linear` converts element by element, several times
slower than float32. The packed copy is then float32 (the bf16 values exactly), the few
activations are widened and the result rounded once to bfloat16 -- the rounding a bf16 GEMM with
float32 accumulation makes. It costs twice the bf16 weight's memory beside it; the log says how much.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import nn

import tram.envs as envs

logger = logging.getLogger(__name__)

ENV_SWITCH = "TRAM_CPU_PACKED_LINEAR"
PACKED_DTYPES = (torch.float32, torch.bfloat16)
PackFn = Callable[[torch.Tensor], "torch.Tensor | None"]
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


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight.T + bias through oneDNN's inner product on the packed weight; a float32
    copy of a bf16 weight computes in float32 and rounds the result to x's dtype once."""
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
    packed = extra = 0
    # A module with `pack_stacked` (the gated MLP) packs several of its linears as one weight; those
    # then get no copy of their own (one GEMM runs them all past the skinny kernel's rows).
    stacked: set[int] = set()
    for module in model.modules():
        if hasattr(module, "pack_stacked"):
            packed_stack = module.pack_stacked(pack_weight)
            if packed_stack is not None:
                packed += 1
                extra += packed_stack.numel() * packed_stack.element_size()
                stacked.update(id(linear) for linear in module.stacked_linears())
    for module in model.modules():
        if not hasattr(module, "packed_weight") or id(module) in stacked:
            continue
        weight = _tied_embedding(model) if getattr(module, "tied", False) else module.weight
        module.packed_weight = pack_weight(weight) if weight is not None else None
        if module.packed_weight is not None:
            packed += 1
            extra += weight.numel() * module.packed_weight.element_size()
    if packed:
        logger.info(
            "Packed %d linear weights for oneDNN in %.2f s (%.0f MiB beside the plain weights)",
            packed,
            time.perf_counter() - start,
            extra / 2**20,
        )
    return packed


def _tied_embedding(model: nn.Module) -> torch.Tensor | None:
    """The input embedding's weight, which a tied LM head multiplies by (CausalLM's `model.embed_tokens`)."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    return None if embed is None else embed.weight
