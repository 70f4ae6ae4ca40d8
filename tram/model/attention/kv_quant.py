"""fp8 KV cache (--kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2): the element type and the per-tensor
scales, as vLLM defines them.

A layer's keys are stored as saturate(k / k_scale) in one byte and read as stored * k_scale (values
likewise with v_scale). The scales are per layer (`Attention.k_scale`, `.v_scale`); without a
calibrated checkpoint they are 1.0, as in vLLM. Saturating matters for e4m3: a value past +-448
would otherwise become NaN on some conversions (torch's CPU cast saturates, a GPU's need not).
"""

from __future__ import annotations

import torch

# --kv-cache-dtype -> the cache's torch dtype ("auto": the model's own dtype).
FP8_KV_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def kv_cache_torch_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type for a --kv-cache-dtype value."""
    if cache_dtype == "auto":
        return model_dtype
    if cache_dtype not in FP8_KV_DTYPES:
        raise ValueError(
            f"kv_cache_dtype {cache_dtype!r} is not supported: choose auto or one of {', '.join(FP8_KV_DTYPES)}"
        )
    return FP8_KV_DTYPES[cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x (any float dtype) stored as `dtype`: x / scale, saturated to the format's range, rounded to nearest."""
    limit = torch.finfo(dtype).max
    if scale != 1.0:  # in float32, so a 16-bit x is not rounded twice
        x = x.float() / scale
    return x.clamp(-limit, limit).to(dtype)


def dequantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Stored fp8 values as `dtype`: stored * scale (exact when scale is 1: fp8 fits in any 16-bit float)."""
    if scale == 1.0:
        return x.to(dtype)
    return (x.float() * scale).to(dtype)
