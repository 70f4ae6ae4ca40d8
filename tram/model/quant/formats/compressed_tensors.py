"""compressed-tensors checkpoints (llm-compressor): W4A16 pack-quantized and W8A16, by config group.

  * pack-quantized 4-bit: weight_packed [N, ceil(K / 8)], eight to an int32 along K (value i at bits
    4i) of q + 8 (q signed); weight_scale [N, G]; weight_shape [N, K]; weight_zero_point
    (asymmetric) [ceil(N / 8), G] along N of z + 8; weight_g_idx [K] with actorder "group".
  * pack-quantized 8-bit: four to an int32 of q + 128; int-quantized: weight [N, K] int8. Both
    symmetric per channel, weight_scale [N, 1].
Each config group names its Linears by targets: a class name (Linear), "re:<regex>" or a module name.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from tram.model.quant.formats.base import CheckpointFormat, LayerScheme, SchemeGroups
from tram.model.quant.formats.registry import register, unsupported

if TYPE_CHECKING:
    from tram.model.quant.unpacked import Parts, Unpacked


@register
class CompressedTensors(CheckpointFormat):
    name = "compressed-tensors"
    methods = ("compressed-tensors",)
    supported = (
        "compressed-tensors W4A16 (pack-quantized, group or channel, sym or asym) and "
        "W8A16 (int-quantized or pack-quantized, symmetric per channel)"
    )
    tensors = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx", "weight")
    marker = "weight_scale"

    def parse(self, config: dict[str, Any]) -> SchemeGroups:
        for key in ("sparsity_config", "transform_config"):
            sub = config.get(key)
            if sub and (key != "sparsity_config" or sub.get("format") not in (None, "dense")):
                raise unsupported(f"compressed-tensors with {key}")
        parsed = _validated(config)
        if parsed.kv_cache_scheme is not None:
            raise unsupported("compressed-tensors with a quantized KV cache (kv_cache_scheme)")
        groups = [
            (tuple(scheme.targets), _scheme(name, scheme, scheme.format or parsed.format))
            for name, scheme in parsed.config_groups.items()
        ]
        if not groups:
            raise unsupported("compressed-tensors without config_groups")
        return groups

    def matches(self, module_name: str, target: str) -> bool:
        if target.startswith("re:"):
            return re.match(target[3:], module_name) is not None
        return target == "Linear" or super().matches(module_name, target)

    def unpack(self, scheme: LayerScheme, parts: Parts) -> Unpacked:
        from tram.model.quant.checkpoint_weight import int8_weight  # torch: only when a checkpoint loads
        from tram.model.quant.unpacked import Int4Parts, unpack_int32

        if scheme.bits == 8:
            if "weight_packed" in parts:
                n, k = (int(v) for v in parts["weight_shape"].tolist())
                q = unpack_int32(parts["weight_packed"], dim=1, bits=8)[:, :k] - 128
            else:
                q = parts["weight"]
                n = q.shape[0]
            return int8_weight(q, parts["weight_scale"].reshape(n))
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        q = unpack_int32(parts["weight_packed"], dim=1)[:, :k]  # [N, K], q + 8
        zero = None if scheme.symmetric else unpack_int32(parts["weight_zero_point"], dim=0)[:n]  # [N, G], z + 8
        group = k if not scheme.group_size or scheme.group_size <= 0 else scheme.group_size
        scale = parts["weight_scale"].reshape(n, -1)
        return Int4Parts(q, scale, zero, group, parts.get("weight_g_idx"))


def _validated(config: dict[str, Any]) -> Any:  # compressed_tensors' QuantizationConfig
    """The config validated by compressed-tensors' own schema (its defaults and spellings)."""
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        raise ValueError(
            "compressed-tensors checkpoints need the compressed-tensors package to read their "
            "config: pip install compressed-tensors"
        ) from None
    # compressed-tensors 0.20 refuses actorder "group", which older checkpoints hold with their
    # weight_g_idx; the g_idx tensor alone says the order, so the flag is dropped before validating.
    config = json.loads(json.dumps(config))
    for group in (config.get("config_groups") or {}).values():
        if isinstance(group, dict) and (group.get("weights") or {}).get("actorder") == "group":
            group["weights"]["actorder"] = None
    try:
        return QuantizationConfig.model_validate(config)
    except Exception as err:  # pydantic's ValidationError, or the package's own checks
        raise ValueError(f"compressed-tensors quantization_config is not valid: {err}") from None


def _scheme(name: str, scheme: Any, fmt: str | None) -> LayerScheme:
    """One config group's weights as a LayerScheme, or the error naming what Tram cannot run."""
    w = scheme.weights
    if w is None:
        raise unsupported(f"compressed-tensors group {name} without quantized weights")
    kind = f"{'fp' if w.type == 'float' else 'W'}{w.num_bits}"
    acts = scheme.input_activations
    if acts is not None:
        raise unsupported(f"compressed-tensors {kind}A{acts.num_bits} (group {name}: quantized activations)")
    if w.type != "int":
        raise unsupported(f"compressed-tensors {w.type}{w.num_bits} weights (group {name})")
    if w.num_bits not in (4, 8):
        raise unsupported(f"compressed-tensors {w.num_bits}-bit weights (group {name})")
    strategy = str(w.strategy)
    if strategy not in ("group", "channel") or w.dynamic:
        raise unsupported(f"compressed-tensors {kind}A16 with strategy {strategy} (group {name})")
    if w.num_bits == 4 and fmt != "pack-quantized":
        raise unsupported(f"compressed-tensors W4A16 in format {fmt!r} (group {name})")
    if w.num_bits == 8 and (fmt not in ("pack-quantized", "int-quantized") or strategy != "channel" or not w.symmetric):
        raise unsupported(
            f"compressed-tensors W8A16 {strategy} {'sym' if w.symmetric else 'asym'} in format "
            f"{fmt!r} (group {name}): only symmetric per channel"
        )
    group = int(w.group_size) if strategy == "group" and w.group_size else -1
    return LayerScheme(w.num_bits, group, bool(w.symmetric))
