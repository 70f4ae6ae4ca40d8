"""oneDNN-packed weights for the CPU linear layers (vLLM's CPU backend packs them the same way).

Why: PyTorch's float32 `F.linear` goes to MKL's sgemm on nn.Linear's [N, K] layout, which reached
40-170 GFLOP/s on the shapes of a decode or mixed step on this project's 2-core VM, while oneDNN's
inner product on a weight reordered once into its blocked layout reached 170-210 (float32) and
270-400 (bfloat16 with AVX512-BF16) on the same shapes, with or without AVX-512 (docs/benchmarks.md,
"oneDNN-packed linear weights"). The reorder happens once, after loading; the packed copy lives
beside the plain weight, which the skinny kernel (one or two rows), the embedding (a tied LM head)
and everything that reads `weight` keep using.

A weight is packed when torch was built with oneDNN, the dtype is float32 or bfloat16, and oneDNN
can run it here (bfloat16 needs AVX512-BF16 or AVX-NE-CONVERT; elsewhere the reorder refuses and the
layer keeps `F.linear`). TRAM_CPU_PACKED_LINEAR=0 switches packing off.
"""
from __future__ import annotations

import logging
import os
import time

import torch
from torch import nn

logger = logging.getLogger(__name__)

ENV_SWITCH = "TRAM_CPU_PACKED_LINEAR"
PACKED_DTYPES = (torch.float32, torch.bfloat16)
# The batch size oneDNN picks the blocked layout for (vLLM's choice too); any row count runs on it.
_LAYOUT_ROWS = 32


def packing_enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip() != "0" and torch.backends.mkldnn.is_available()


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [N, K] reordered into oneDNN's blocked layout, or None where oneDNN cannot run it here."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES or weight.dim() != 2:
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _LAYOUT_ROWS)
    except RuntimeError as exc:  # e.g. bfloat16 on a CPU without bf16 instructions
        logger.debug("not packing a %s %s weight for oneDNN: %s", weight.dtype, tuple(weight.shape), exc)
        return None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight.T + bias through oneDNN's inner product on the packed weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_cpu_linears(model: nn.Module) -> int:
    """Pack the weight of every module that has a `packed_weight` slot (Linear, LMHead); returns how
    many were packed. A no-op off the CPU or where packing is switched off."""
    if not packing_enabled():
        return 0
    start = time.perf_counter()
    packed = extra = 0
    for module in model.modules():
        if not hasattr(module, "packed_weight"):
            continue
        weight = _tied_embedding(model) if getattr(module, "tied", False) else module.weight
        module.packed_weight = pack_weight(weight) if weight is not None else None
        if module.packed_weight is not None:
            packed += 1
            extra += weight.numel() * weight.element_size()
    if packed:
        logger.info("Packed %d linear weights for oneDNN in %.2f s (%.0f MiB beside the plain weights)",
                    packed, time.perf_counter() - start, extra / 2**20)
    return packed


def _tied_embedding(model: nn.Module) -> torch.Tensor | None:
    """The input embedding's weight, which a tied LM head multiplies by (CausalLM's `model.embed_tokens`)."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    return None if embed is None else embed.weight
