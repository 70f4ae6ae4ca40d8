"""Llama 3.x RoPE from a GGUF file: convert_hf_to_gguf.py writes the frequency factors as a tensor
(`rope_freqs.weight`, one divisor per rotary pair) instead of the config's llama3 parameters.

The factors are a function of (factor, low_freq_factor, high_freq_factor, original context), so
the parameters are recovered by matching the published Llama 3.1 / 3.2 settings against the tensor;
a file whose factors match none of them is refused rather than served with a wrong RoPE.
"""

from __future__ import annotations

import math
from typing import Any

# (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
_KNOWN = ((8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192), (16.0, 1.0, 4.0, 8192))


def llama3_factors(theta: float, dim: int, factor: float, low: float, high: float, original: int) -> list[float]:
    """The divisor of each rotary pair's frequency, as convert_hf_to_gguf.py computes it."""
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def llama3_rope_parameters(tensor: Any, theta: float, dim: int, path: str) -> dict[str, Any]:
    """rope_parameters entries for the file's `rope_freqs.weight` (a gguf ReaderTensor)."""
    factors = [float(v) for v in tensor.data.reshape(-1)]
    dim = dim or 2 * len(factors)
    for factor, low, high, original in _KNOWN:
        want = llama3_factors(theta, dim, factor, low, high, original)
        if len(want) == len(factors) and all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(want, factors)):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise ValueError(
        f"{path}: rope_freqs.weight matches no known Llama 3 RoPE scaling (factor/low/high/original in {list(_KNOWN)})"
    )
