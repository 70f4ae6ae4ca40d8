"""The CPU fused mixture-of-experts kernel (csrc/fused_moe.cpp) behind a small Python call.

Why: a decode step of a many-expert layer touches most experts with a token or two each; per-expert
linears would each be a short parallel region that never reaches the memory bandwidth. The kernel
groups the (token, slot) pairs by expert, runs the gate/up projections of all active experts in one
parallel region with the activation fused, the down projections in a second, and combines each
token's slots in slot order (the result does not depend on the thread count).

`cpu_fused_moe` returns None where the kernel does not apply (kernels unavailable, a GPU tensor,
autograd, an unsupported format or dtype), and the caller keeps its PyTorch path.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from tram.model.gguf.weight import K_QUANTS
from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.layers.moe.experts import ExpertWeights

# The kernel's format codes; float weights must be in x's dtype. GGUF K-quants with int8 activations are
# format 4 (inputs quantized per 256 values, llama.cpp's Q8_K).
_FORMATS = {"float": 0, "int8": 1, "int4": 2, "gguf": 3}
_GGUF_INT8 = 4
_ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16)
# GGUF block types the kernel decodes (gguf_blocks.h): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; with
# int8 activations, the K-quants (gguf_q8k.h).
_GGUF_TYPES = frozenset({2, 3, 6, 7, 8, 12, 13, 14})
# Tokens per kernel call: the kernel holds three float32 rows per (token, slot) pair (the gathered x, the
# activation and the down projection), 16 KiB per slot at hidden 2048; a long prefill goes through in
# pieces of this many tokens (each still gives its experts tens of tokens to multiply at once).
MAX_TOKENS_PER_CALL = 1024
# With bfloat16 experts (AMX tiles, or ATen's GEMM for experts with many tokens) a call costs about one
# read of each active expert's weights, and every piece reads them again, so a step's tokens go in one
# call up to the default token budget (~110 KiB of buffers per token at hidden 2048, kept for the next
# call, their pages touched only where used).
BF16_TOKENS_PER_CALL = 4096


def _supported(fmt: ExpertWeights, x: torch.Tensor) -> bool:
    if fmt.kind not in _FORMATS or fmt.data.device.type != "cpu" or fmt.data.dim() != 3:
        return False
    if not fmt.data.is_contiguous() or (fmt.scale is not None and not fmt.scale.is_contiguous()):
        return False  # the kernel streams the stored layout; a copy per call would cost more than it saves
    if fmt.kind == "float":
        return fmt.data.dtype == x.dtype
    if fmt.kind in ("int8", "int4"):
        if fmt.scale is None or fmt.scale.dtype != torch.float32:
            return False
        if fmt.zero is not None and not (fmt.zero.dtype == torch.uint8 and fmt.zero.is_contiguous()):
            return False
        if fmt.kind == "int4":
            k, g = fmt.in_features, fmt.group
            return g > 0 and g % 32 == 0 and k % g == 0
        return True
    return fmt.ggml_type in (K_QUANTS if fmt.int8_activations else _GGUF_TYPES)


def takes_int8_activations(w13: ExpertWeights, w2: ExpertWeights) -> bool:
    """Whether both projections are GGUF K-quants under `--gguf-activations int8`, which the kernel
    multiplies in integers at every token count (other int8-activation experts take the grouped path)."""
    return all(w.kind == "gguf" and w.int8_activations and w.ggml_type in K_QUANTS for w in (w13, w2))


def _format(fmt: ExpertWeights) -> int:
    return _GGUF_INT8 if fmt.kind == "gguf" and fmt.int8_activations else _FORMATS[fmt.kind]


@dataclass(frozen=True)
class FusedMoECall:
    """The kernel bound to one layer's weights, checked once: calling it with (x, topk_ids, topk_weights)
    runs the experts. At decode the checks cost more than the router's choice itself, so a layer keeps
    this and pays only for x's."""

    module: ModuleType
    dtype: torch.dtype
    args: tuple[Any, ...]  # fused_moe's arguments after (x, topk_ids, topk_weights)
    max_tokens: int = MAX_TOKENS_PER_CALL  # a longer x goes in pieces of this many tokens

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor | None:
        if x.dtype != self.dtype or x.dim() != 2 or kernels_for(x) is None:
            return None
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
        weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
        x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
        if x.shape[0] <= self.max_tokens:
            return self.module.fused_moe(x, ids, weights, *self.args)
        step = self.max_tokens
        pieces = [
            self.module.fused_moe(x[i : i + step], ids[i : i + step], weights[i : i + step], *self.args)
            for i in range(0, x.shape[0], step)
        ]
        return torch.cat(pieces)


def bind_fused_moe(
    x: torch.Tensor,  # a [T, H] float32 or bfloat16 input of the kind the call will take
    w13: ExpertWeights,  # [E, 2I, H]: gate rows then up rows
    w2: ExpertWeights,  # [E, H, I]
    b13: torch.Tensor | None,  # [E, 2I]
    b2: torch.Tensor | None,  # [E, H]
    activation: str,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> FusedMoECall | None:
    """The kernel bound to these weights for inputs like x; None where it does not apply."""
    if x.dtype not in _FLOAT_DTYPES or x.dim() != 2 or activation not in _ACTIVATIONS:
        return None
    if not (_supported(w13, x) and _supported(w2, x)):
        return None
    module = kernels_for(x)
    if module is None or not hasattr(module, "fused_moe"):
        return None
    args = (w13.data, w13.scale, _format(w13), w13.param(), w2.data, w2.scale, _format(w2), w2.param())
    rest = (b13, b2, _ACTIVATIONS[activation], float(alpha), float(limit), w13.zero, w2.zero)
    max_tokens = BF16_TOKENS_PER_CALL if takes_every_token_count(x, w13, w2) else MAX_TOKENS_PER_CALL
    return FusedMoECall(module, x.dtype, args + rest, max_tokens)


def takes_every_token_count(x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights) -> bool:
    """Whether the kernel beats the grouped path at every token count: bfloat16 x and experts, whose
    experts with many tokens it multiplies on AMX tiles or through ATen's GEMM (oneDNN) over buffers it
    keeps, where the grouped path pays a gather, a scatter and fresh intermediates per expert."""
    if x.dtype != torch.bfloat16 or not (w13.kind == w2.kind == "float"):
        return False
    if w13.data.dtype != torch.bfloat16 or w2.data.dtype != torch.bfloat16 or w13.data.dim() != 3:
        return False
    module = kernels_for(x)
    return module is not None and hasattr(module, "fused_moe")


def cpu_fused_moe(
    x: torch.Tensor,  # [T, H] float32 or bfloat16
    topk_ids: torch.Tensor,  # [T, k] local expert ids, -1: not on this rank
    topk_weights: torch.Tensor,  # [T, k] float32
    *layer: Any,  # bind_fused_moe's arguments after x: w13, w2, b13, b2, activation[, alpha, limit]
) -> torch.Tensor | None:
    """sum over slots j of topk_weights[t, j] * expert e's MLP of x[t] (e = topk_ids[t, j]), float32
    inside and rounded once to x's dtype; None where the kernel does not apply."""
    call = bind_fused_moe(x, *layer)
    return None if call is None else call(x, topk_ids, topk_weights)
