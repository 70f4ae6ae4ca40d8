"""Rotary position embedding (rotate-half convention, as Hugging Face Llama) with a cos/sin cache.

The cache is indexed by absolute positions, so a flattened batch of prefill chunks and decodes
needs no per-request bookkeeping: row t of the batch simply reads cache[positions[t]].
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tram.config.hf_snapshot import HFConfigSnapshot
from tram.model.kernels.cpu_kernels import kernels_for

logger = logging.getLogger(__name__)

_DEFAULT_THETA = 10000.0
_SLIDING = "sliding_attention"
# Rope types whose scaling stretches the usable context beyond max_position_embeddings.
_STRETCHING_TYPES = ("linear", "dynamic")


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope settings as one flat dict with at least rope_type and rope_theta.

    transformers >= 5 configs carry `rope_parameters`; older ones carry `rope_theta` and an optional
    `rope_scaling` dict whose type key is `rope_type` or the legacy `type`.

    layer_type names a kind of layer with its own RoPE (Gemma 3: "full_attention", "sliding_attention").
    transformers >= 5 keys rope_parameters by it; older Gemma 3 configs give global layers rope_theta and
    rope_scaling, and sliding layers a default RoPE of base rope_local_base_freq.
    """
    if layer_type is not None and rope_keyed_by_layer_type(hf_config):
        keyed = hf_config.rope_parameters
        if layer_type not in keyed:
            raise ValueError(f"rope_parameters has no entry for layer type {layer_type!r}: {sorted(keyed)}")
        return _flat_rope_parameters(dict(keyed[layer_type] or {}), hf_config)
    if layer_type == _SLIDING and getattr(hf_config, "rope_local_base_freq", None) is not None:
        return {"rope_type": "default", "rope_theta": float(hf_config.rope_local_base_freq)}
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if not params:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
    return _flat_rope_parameters(params, hf_config)


def rope_keyed_by_layer_type(hf_config: Any) -> bool:
    """True for transformers >= 5 configs whose rope_parameters hold one dict per layer type."""
    params = getattr(hf_config, "rope_parameters", None)
    return isinstance(params, dict) and any(isinstance(v, dict) for v in params.values())


def _flat_rope_parameters(params: dict[str, Any], hf_config: Any) -> dict[str, Any]:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type  # LongRoPE's name in early Phi-3 configs
    theta = params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or _DEFAULT_THETA
    params.update(rope_type=rope_type, rope_theta=float(theta))
    return params


def _rotary_dim(params: dict[str, Any], hf_config: Any, head_dim: int) -> int:
    """The features of a head that rotate: transformers >= 5 keeps partial_rotary_factor (Phi-4-mini:
    0.75) in rope_parameters, older configs at the top level."""
    factor = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    return int(head_dim * (1.0 if factor is None else float(factor)))


def longrope_original_positions(hf_config: Any, layer_type: str | None = None) -> int:
    """The context LongRoPE's short factors were trained for (original_max_position_embeddings)."""
    params = rope_parameters(hf_config, layer_type)
    original = params.get("original_max_position_embeddings") or getattr(
        hf_config, "original_max_position_embeddings", None
    )
    if not original:
        raise ValueError("rope_type longrope needs original_max_position_embeddings in the config")
    return int(original)


def longrope_uses_long_factors(hf_config: Any, max_model_len: int | None, layer_type: str | None = None) -> bool:
    """Whether a context of max_model_len tokens (default: max_position_embeddings) rotates with the
    long factors.

    transformers picks the set per forward pass from the sequence's length and, when a sequence
    grows past original_max_position_embeddings, drops its KV cache and prefills again with the long
    factors. A paged cache shared across steps cannot re-rotate, so the set is chosen once from the
    longest context served, as vLLM does: identical to transformers for every sequence when
    max_model_len <= original_max_position_embeddings, and for sequences longer than that otherwise.
    """
    served = max_model_len or int(getattr(hf_config, "max_position_embeddings", 0) or 0)
    return served > longrope_original_positions(hf_config, layer_type)


def _longrope_inv_freq(
    params: dict[str, Any], hf_config: Any, head_dim: int, long: bool, original: int
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3, Phi-4-mini) as transformers' _compute_longrope_parameters: each base frequency
    divided by its factor of the short or the long set; cos/sin scaled by the attention factor."""
    factor = params.get("factor") or float(hf_config.max_position_embeddings) / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    rotary_dim = _rotary_dim(params, hf_config, head_dim)
    factors = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32, device="cpu")
    if factors.numel() != rotary_dim // 2:
        raise ValueError(f"longrope has {factors.numel()} factors; its rotary dimension needs {rotary_dim // 2}")
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    return 1.0 / (factors * params["rope_theta"] ** exponents), float(attention_factor)


def _yarn_original_positions(params: dict[str, Any], hf_config: Any) -> int:
    """The pretraining context YaRN stretches, as transformers' standardize_rope_params settles it: a
    top-level original_max_position_embeddings first (Phi-3 style configs), then rope_parameters', then
    max_position_embeddings."""
    top = getattr(hf_config, "original_max_position_embeddings", None)
    if top is not None and not rope_keyed_by_layer_type(hf_config):
        return int(top)
    return int(params.get("original_max_position_embeddings") or hf_config.max_position_embeddings)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(params: dict[str, Any], hf_config: Any, head_dim: int) -> tuple[torch.Tensor, float]:
    """YaRN (gpt-oss, Qwen3 and others with rope_type "yarn") as transformers' _compute_yarn_parameters,
    op for op in float32: base frequencies kept (extrapolated) for the fast dimensions, divided by factor
    (interpolated) for the slow ones, with a linear ramp between the dimensions that make beta_fast and
    beta_slow turns over the original context (its ends rounded outwards unless truncate is false);
    cos/sin scaled by the attention factor (given, or from factor and mscale / mscale_all_dim)."""
    base = params["rope_theta"]
    dim = _rotary_dim(params, hf_config, head_dim)
    original = _yarn_original_positions(params, hf_config)
    factor = params.get("factor")
    if factor is None:
        factor = hf_config.max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:  # the dimension that turns num_rotations times
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of one step, not a division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp  # the share of each dimension that keeps its base frequency
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _inv_freq_and_scaling(
    hf_config: Any, head_dim: int, layer_type: str | None, max_model_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float32, CPU) and the cos/sin multiplier, exactly as transformers computes them."""
    params = rope_parameters(hf_config, layer_type)
    rope_type = params["rope_type"]
    if rope_type == "default":
        rotary_dim = _rotary_dim(params, hf_config, head_dim)
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    if rope_type == "longrope":  # computed here: the factor set depends on the context served
        long = longrope_uses_long_factors(hf_config, max_model_len, layer_type)
        return _longrope_inv_freq(params, hf_config, head_dim, long, longrope_original_positions(hf_config, layer_type))
    if rope_type == "yarn":  # computed here: no transformers in a worker
        return _yarn_inv_freq(params, hf_config, head_dim)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported; supported: default, {', '.join(ROPE_INIT_FUNCTIONS)}"
        )
    # Positional device argument: the keyword name differs between transformers 4 and 5. Only
    # transformers >= 5 keys rope_parameters by layer type, and only its functions take layer_type.
    kwargs = {"layer_type": layer_type} if layer_type is not None and rope_keyed_by_layer_type(hf_config) else {}
    # transformers' functions call the config's methods: a worker's snapshot becomes the config again.
    config = hf_config.to_hf_config() if isinstance(hf_config, HFConfigSnapshot) else hf_config
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **kwargs)
    return inv_freq.to(device="cpu", dtype=torch.float32), float(scaling)


def _cache_length(hf_config: Any, layer_type: str | None) -> int:
    max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
    params = rope_parameters(hf_config, layer_type)
    if params["rope_type"] in _STRETCHING_TYPES and params.get("factor"):
        max_pos = int(max_pos * float(params["factor"]))
    return max_pos


class RotaryEmbedding(nn.Module):
    """Applies RoPE to query and key of a flattened batch.

    cos/sin are computed in float32 once, then cast to the activation dtype at use, as transformers does.
    The cache is a plain attribute, not a buffer: the loader builds models on the meta device and
    allocates every buffer anew (weight_utils.materialize), which would wipe one. It follows the input's device lazily.

    Dynamic NTK scaling is static here: it matches transformers for positions below
    max_position_embeddings (transformers re-derives frequencies beyond that, which a KV cache cannot follow).
    """

    def __init__(
        self, hf_config: Any, head_dim: int, max_positions: int | None = None, layer_type: str | None = None
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        # What set_max_model_len rebuilds the cache from (LongRoPE's factors depend on the context served).
        self._source = (hf_config, layer_type, max_positions)
        self._build(None)

    def _build(self, max_model_len: int | None) -> None:
        hf_config, layer_type, max_positions = self._source
        # Forced onto the CPU so that building the model under a meta device context still yields numbers.
        with torch.device("cpu"):
            inv_freq, scaling = _inv_freq_and_scaling(hf_config, self.head_dim, layer_type, max_model_len)
            self.rotary_dim = 2 * inv_freq.numel()
            num_pos = max_positions or _cache_length(hf_config, layer_type)
            freqs = torch.outer(torch.arange(num_pos, dtype=torch.float32), inv_freq)  # [P, rotary_dim/2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [P, rotary_dim]
            self._cos_sin = torch.stack((emb.cos() * scaling, emb.sin() * scaling))  # [2, P, rotary_dim]

    def set_max_model_len(self, max_model_len: int) -> None:
        """Fit the rotation to the longest context served: LongRoPE chooses its factor set from it
        (longrope_uses_long_factors); every other kind does not depend on it."""
        hf_config, layer_type, _ = self._source
        if rope_parameters(hf_config, layer_type)["rope_type"] != "longrope":
            return
        self._build(max_model_len)
        if longrope_uses_long_factors(hf_config, max_model_len, layer_type):
            logger.info(
                "LongRoPE: long factors at every position (max_model_len %d > original_max_position_embeddings "
                "%d; transformers uses the short ones for sequences up to that length)",
                max_model_len,
                longrope_original_positions(hf_config, layer_type),
            )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin rows for positions [T], each [T, 1, rotary_dim] in dtype (broadcast over heads)."""
        if self._cos_sin.device != positions.device:
            self._cos_sin = self._cos_sin.to(positions.device)
        cos_sin = self._cos_sin[:, positions].to(dtype)  # [2, T, rotary_dim]
        return cos_sin[0].unsqueeze(1), cos_sin[1].unsqueeze(1)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; query [T, H, D]; key [T, Hkv, D] -> rotated (query, key), same shapes."""
        cos, sin = self.cos_sin(positions, query.dtype)
        return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)


class LayerTypeRotaryEmbedding(nn.Module):
    """One RoPE per kind of layer (Gemma 3: a local base for sliding layers, a global one for full ones).

    `cos_sin` computes each kind's rows once per step; every layer then picks its kind's pair. Kinds
    with the same settings (Gemma 2's: one RoPE for all layers) share one table and one computation.
    """

    def __init__(self, hf_config: Any, head_dim: int, layer_types: Sequence[str]) -> None:
        super().__init__()
        self.source: dict[str, str] = {}  # layer type -> the first type with its settings, which owns the table
        firsts: dict[str, str] = {}
        for t in sorted(set(layer_types)):
            self.source[t] = firsts.setdefault(repr(sorted(rope_parameters(hf_config, t).items())), t)
        self.ropes = nn.ModuleDict(
            {t: RotaryEmbedding(hf_config, head_dim, layer_type=t) for t in sorted(set(self.source.values()))}
        )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Layer type -> (cos, sin), each [T, 1, rotary_dim] in dtype."""
        rows = {t: rope.cos_sin(positions, dtype) for t, rope in self.ropes.items()}
        return {t: rows[first] for t, first in self.source.items()}


def fit_rope_to_context(model: nn.Module, max_model_len: int) -> None:
    """Tell every RoPE of the model the longest context it will serve (see set_max_model_len)."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.set_max_model_len(max_model_len)


def apply_rotary_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query [T, H, D] and key [T, Hkv, D] with cos/sin [T, 1, rotary_dim].

    On CPU the C++ kernel rotates both in place in one call (bitwise the same as `apply_rotary`),
    so q and k must be tensors nobody else reads, such as fresh projections (or column slices of one
    fresh projection: each token's heads contiguous, tokens any stride apart).
    """
    kernels = kernels_for(q)
    if kernels is not None and _token_rows(q) and _token_rows(k) and k.dtype == q.dtype:
        kernels.rotary_(q, k, cos.squeeze(1), sin.squeeze(1))
        return q, k
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def _token_rows(x: torch.Tensor) -> bool:
    """x [T, H, D] as rows of tokens: each token's H * D values contiguous, tokens apart (any stride
    past that, as in column slices of one GEMM's output), so rotating in place touches each once."""
    heads = x.stride(2) == 1 and (x.size(1) == 1 or x.stride(1) == x.size(2))
    return heads and (x.size(0) <= 1 or x.stride(0) >= x.size(1) * x.size(2))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, 1, rotary_dim] from `RotaryEmbedding.cos_sin`.

    Only the first rotary_dim features rotate (partial rotary); the rest pass through.
    """
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
