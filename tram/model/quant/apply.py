"""Quantizing a loaded float model's linear layers (and MoE experts) on the fly (`quantization="int8"` / `"int4"`, the
methods names.ON_THE_FLY lists; check.py says whether they run on a device).

Every `Linear` (q/k/v, o, gate/up, down; their tensor-parallel shards too) gets a `quant` weight
and gives up its float one; the embedding and the LM head stay in the model's dtype, as in vLLM
and llama.cpp's usual mixes (the head is one layer, and its precision shows in every logit).
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from tram.model.quant.weights import Int4Weight, Int8Weight, QuantizedWeight, int4_group_size

logger = logging.getLogger(__name__)


def quantize_weight(method: str, weight: torch.Tensor) -> tuple[QuantizedWeight, str]:
    """The weight in `method`'s format, and the format actually used: int4 falls back to int8 where
    no group size divides the input width (K a multiple of 32 is needed)."""
    if method == "int4":
        group = int4_group_size(weight.shape[1])
        if group is not None:
            return Int4Weight(weight, group), f"int4 (group {group})"
    return Int8Weight(weight), "int8"


@torch.no_grad()
def quantize_linears(model: nn.Module, method: str) -> int:
    """Quantize every Linear of a loaded model in place; returns how many. The float weight is
    replaced by an empty one of the same dtype (the layer's dtype stays readable)."""
    from tram.model.layers.linear import Linear

    start = time.perf_counter()
    before = after = count = 0
    formats: dict[str, int] = {}
    for module in model.modules():
        if not isinstance(module, Linear) or module.quant is not None:
            continue
        weight = module.weight
        module.quant, used = quantize_weight(method, weight)
        formats[used] = formats.get(used, 0) + 1
        before += weight.numel() * weight.element_size()
        after += module.quant.nbytes
        module.weight = nn.Parameter(torch.empty(0, dtype=weight.dtype, device=weight.device), requires_grad=False)
        module.packed_weight = None
        count += 1
    for module in model.modules():
        if hasattr(module, "quantize_"):  # stacked expert weights (layers/moe/layer.py): int8 or int4 alike
            size_before, size_after = module.quantize_(method)
            formats[f"experts {method}"] = formats.get(f"experts {method}", 0) + 1
            before += size_before
            after += size_after
            count += 1
    if count:
        used = ", ".join(f"{n} {f}" for f, n in sorted(formats.items()))
        logger.info(
            "Quantized %d linear layers (%s) in %.2f s: %.1f MiB -> %.1f MiB",
            count,
            used,
            time.perf_counter() - start,
            before / 2**20,
            after / 2**20,
        )
    return count
