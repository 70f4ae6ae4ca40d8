"""Hugging Face quantized checkpoints: GPTQ, AWQ and compressed-tensors, as `quantization_config` in
config.json names them (ModelConfig.quantization carries the method).

`parse_scheme` reads that config and raises ValueError, naming the scheme and what is supported, for
anything Tram cannot run; `check` adds the placement rules (CPU or CUDA). While loading, a
`CheckpointLoader` takes the quantized Linears' tensors (qweight/qzeros/scales/g_idx,
weight_packed/weight_scale/...) out of the stream, and at the end gives each such Linear its `quant`
(checkpoint_formats.py repacks them; checkpoint_shards.py cuts a rank's slice first) and an empty
float weight; every other tensor loads as usual.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tram.model.quant.checkpoint_formats import (Int4Parts, Parts, awq_parts, compressed_int4_parts,
                                                 compressed_int8, gptq_parts, int4_weight)
from tram.model.quant.checkpoint_shards import Unpacked, full_shape, layer_shard, shard_weight

logger = logging.getLogger(__name__)

CHECKPOINT_METHODS = ("gptq", "awq", "compressed-tensors")
SUPPORTED = ("GPTQ 4-bit (group or per-channel, desc_act false or true, sym or asym; gptq or gptq_v2 format), "
             "AWQ 4-bit GEMM, compressed-tensors W4A16 (pack-quantized, group or channel, sym or asym) and "
             "W8A16 (int-quantized or pack-quantized, symmetric per channel)")

# Per layer kind: the tensor suffixes it consumes, and the one that marks a Linear as quantized.
_SUFFIXES = {
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
    "awq": ("qweight", "qzeros", "scales"),
    "ct": ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx", "weight"),
}
_MARKERS = {"gptq": "qweight", "awq": "qweight", "ct": "weight_scale"}


@dataclass(frozen=True)
class LayerScheme:
    """How one Linear is stored: kind (gptq, awq, ct), bits, group size (-1: per channel), symmetric,
    and GPTQ's v1 zero-point convention."""

    kind: str
    bits: int = 4
    group_size: int = -1
    symmetric: bool = True
    v1: bool = True


@dataclass
class CheckpointScheme:
    """A checkpoint's quantization: one scheme for every quantized Linear (GPTQ, AWQ), or one per
    compressed-tensors config group, picked by its targets."""

    method: str
    groups: list[tuple[tuple[str, ...], LayerScheme]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.groups[0][1].kind

    def layer_scheme(self, module_name: str) -> LayerScheme:
        if len(self.groups) == 1:
            return self.groups[0][1]
        for targets, scheme in self.groups:
            if any(_matches(module_name, t) for t in targets):
                return scheme
        raise ValueError(f"no quantization_config group targets the quantized layer {module_name}")


def _matches(name: str, target: str) -> bool:
    """compressed-tensors' targets: a class name (Linear), "re:<regex>", or a module name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == "Linear" or name == target or name.endswith("." + target)


def _unsupported(what: str) -> ValueError:
    return ValueError(f"quantized checkpoint: {what} is not supported; Tram reads {SUPPORTED}")


def _config_dict(hf_config: Any) -> dict[str, Any]:
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return {}
    return config if isinstance(config, dict) else config.to_dict()


def parse_scheme(hf_config: Any) -> CheckpointScheme:
    """The checkpoint's quantization, or ValueError naming the unsupported scheme."""
    config = _config_dict(hf_config)
    method = str(config.get("quant_method", "")).lower()
    if method == "gptq":
        return CheckpointScheme("gptq", [((), _gptq_scheme(config))])
    if method == "awq":
        return CheckpointScheme("awq", [((), _awq_scheme(config))])
    if method == "compressed-tensors":
        return CheckpointScheme("compressed-tensors", _compressed_groups(config))
    raise _unsupported(f"quant_method {method!r}")


def _gptq_scheme(config: dict[str, Any]) -> LayerScheme:
    bits = int(config.get("bits", 4))
    if bits != 4:
        raise _unsupported(f"GPTQ {bits}-bit")
    fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _unsupported(f"GPTQ checkpoint_format {fmt!r}")
    if config.get("lm_head"):
        raise _unsupported("GPTQ with a quantized lm_head")
    if config.get("dynamic"):
        raise _unsupported("GPTQ with per-module overrides (dynamic)")
    return LayerScheme("gptq", 4, int(config.get("group_size", 128)), bool(config.get("sym", True)), fmt == "gptq")


def _awq_scheme(config: dict[str, Any]) -> LayerScheme:
    bits = int(config.get("bits", config.get("w_bit", 4)))
    if bits != 4:
        raise _unsupported(f"AWQ {bits}-bit")
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise _unsupported(f"AWQ {version.upper()}")
    if not config.get("zero_point", True):
        raise _unsupported("AWQ without zero points (zero_point false)")
    return LayerScheme("awq", 4, int(config.get("group_size", config.get("q_group_size", 128))), False)


def _compressed_config(config: dict[str, Any]) -> Any:  # compressed_tensors' QuantizationConfig
    """The config validated by compressed-tensors' own schema (its defaults and spellings)."""
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        raise ValueError("compressed-tensors checkpoints need the compressed-tensors package to read their "
                         "config: pip install compressed-tensors") from None
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


def _compressed_groups(config: dict[str, Any]) -> list[tuple[tuple[str, ...], LayerScheme]]:
    for key in ("sparsity_config", "transform_config"):
        sub = config.get(key)
        if sub and (key != "sparsity_config" or sub.get("format") not in (None, "dense")):
            raise _unsupported(f"compressed-tensors with {key}")
    parsed = _compressed_config(config)
    if parsed.kv_cache_scheme is not None:
        raise _unsupported("compressed-tensors with a quantized KV cache (kv_cache_scheme)")
    groups = [(tuple(scheme.targets), _compressed_scheme(name, scheme, scheme.format or parsed.format))
              for name, scheme in parsed.config_groups.items()]
    if not groups:
        raise _unsupported("compressed-tensors without config_groups")
    return groups


def _compressed_scheme(name: str, scheme: Any, fmt: str | None) -> LayerScheme:
    w = scheme.weights
    if w is None:
        raise _unsupported(f"compressed-tensors group {name} without quantized weights")
    kind = f"{'fp' if w.type == 'float' else 'W'}{w.num_bits}"
    acts = scheme.input_activations
    if acts is not None:
        raise _unsupported(f"compressed-tensors {kind}A{acts.num_bits} (group {name}: quantized activations)")
    if w.type != "int":
        raise _unsupported(f"compressed-tensors {w.type}{w.num_bits} weights (group {name})")
    if w.num_bits not in (4, 8):
        raise _unsupported(f"compressed-tensors {w.num_bits}-bit weights (group {name})")
    strategy = str(w.strategy)
    if strategy not in ("group", "channel") or w.dynamic:
        raise _unsupported(f"compressed-tensors {kind}A16 with strategy {strategy} (group {name})")
    if w.num_bits == 4 and fmt != "pack-quantized":
        raise _unsupported(f"compressed-tensors W4A16 in format {fmt!r} (group {name})")
    if w.num_bits == 8 and (fmt not in ("pack-quantized", "int-quantized") or strategy != "channel"
                            or not w.symmetric):
        raise _unsupported(f"compressed-tensors W8A16 {strategy} {'sym' if w.symmetric else 'asym'} in format "
                           f"{fmt!r} (group {name}): only symmetric per channel")
    group = int(w.group_size) if strategy == "group" and w.group_size else -1
    return LayerScheme("ct", w.num_bits, group, bool(w.symmetric))


def check(method: str, device_type: str, hf_config: Any = None, tensor_parallel_size: int = 1) -> None:
    """ValueError at start for a quantized checkpoint Tram cannot run here."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"quantization {method!r} (a quantized checkpoint) runs on CPU and CUDA devices, "
                         f"not {device_type!r}")
    if hf_config is not None:
        scheme = parse_scheme(hf_config)
        if scheme.method != method:
            raise ValueError(f"quantization {method!r} does not match the checkpoint's quant_method "
                             f"{scheme.method!r}")


class CheckpointLoader:
    """Takes a quantized checkpoint's per-Linear tensors out of the loading loop, then sets each
    Linear's `quant` from them (`finish`). Contract with loader.load_model: `plan` on the meta-device
    model (it scans the files); then load_safetensors_weights hands every tensor name that `claims`
    to `add`, and counts `finish`'s parameter names as loaded."""

    def __init__(self, scheme: CheckpointScheme, model: nn.Module, device: torch.device | str = "cpu") -> None:
        from tram.model.layers.linear import Linear

        self.scheme = scheme
        self.device = torch.device(device)  # where the built weights go
        self.linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
        self.suffixes = set(_SUFFIXES[scheme.kind])
        self.quantized: set[str] = set()  # module names whose tensors are quantized
        self.parts: dict[str, Parts] = {}

    def scan(self, names: list[str]) -> None:
        """Learn which Linears are quantized from the checkpoint's tensor names (before loading:
        compressed-tensors' int8 `weight` sorts before the `weight_scale` that marks it)."""
        marker = "." + _MARKERS[self.scheme.kind]
        self.quantized.update(name[:-len(marker)] for name in names if name.endswith(marker))

    def plan(self, files: list[str]) -> None:
        """On the meta-device model, before it is materialised: `scan` the files, and drop the float
        weight of every quantized Linear, so that no device ever allocates the float model."""
        from safetensors import safe_open

        for file in files:
            with safe_open(file, framework="pt", device="cpu") as f:
                self.scan(list(f.keys()))
        for prefix in self.quantized:
            module = self.linears.get(prefix)
            if module is not None and module.weight.is_meta:
                module.weight = nn.Parameter(torch.empty(0, dtype=module.weight.dtype, device="meta"),
                                             requires_grad=False)

    def claims(self, name: str) -> bool:
        prefix, _, suffix = name.rpartition(".")
        return prefix in self.quantized and suffix in self.suffixes

    def add(self, name: str, tensor: torch.Tensor) -> None:
        prefix, _, suffix = name.rpartition(".")
        self.parts.setdefault(prefix, {})[suffix] = tensor

    @torch.no_grad()
    def finish(self) -> set[str]:
        """Build every quantized Linear; returns the names of the parameters so filled."""
        filled: set[str] = set()
        dense: list[str] = []
        for prefix in sorted(self.parts):
            module = self.linears.get(prefix)
            if module is None:
                raise ValueError(f"Checkpoint has quantized tensors for {prefix}, which is no linear layer of "
                                 "the model")
            weight = self._build(prefix, self.parts.pop(prefix))
            _install(module, weight, self.device)
            if isinstance(weight, torch.Tensor):
                dense.append(prefix)
            filled.add(prefix + ".weight")
        if dense:
            logger.warning("%d quantized layers have shapes the int4 kernel cannot take and run dequantized: %s",
                           len(dense), ", ".join(dense[:5]) + (" ..." if len(dense) > 5 else ""))
        logger.info("Read %d %s-quantized linear layers", len(filled), self.scheme.method)
        return filled

    def _build(self, prefix: str, parts: Parts) -> Any:  # QuantizedWeight, or a dense float weight
        module = self.linears[prefix]
        try:
            weight = _unpack(self.scheme.layer_scheme(prefix), parts)
        except KeyError as err:
            raise ValueError(f"Quantized layer {prefix} lacks its {err.args[0]} tensor") from None
        shape = tuple(weight.q.shape) if isinstance(weight, Int4Parts) else (weight.out_features, weight.in_features)
        expected = full_shape(module)  # of the whole layer, whichever slice this rank keeps
        if shape != expected:
            raise ValueError(f"Quantized layer {prefix} holds a {shape[0]}x{shape[1]} weight, the model expects "
                             f"{expected[0]}x{expected[1]}")
        shard = layer_shard(module)
        if shard is not None:
            weight = shard_weight(weight, shard)
        return int4_weight(weight) if isinstance(weight, Int4Parts) else weight


def _unpack(scheme: LayerScheme, parts: Parts) -> Unpacked:
    """A whole layer's int4 values, scales and zero points (to repack), or its int8 weight."""
    if scheme.kind == "gptq":
        return gptq_parts(parts, scheme.group_size, scheme.v1)
    if scheme.kind == "awq":
        return awq_parts(parts, scheme.group_size)
    if scheme.bits == 8:
        return compressed_int8(parts)
    return compressed_int4_parts(parts, scheme.group_size, scheme.symmetric)


def _install(module: nn.Module, weight: Any, device: torch.device) -> None:
    """The Linear computes with `weight` on `device` (it was repacked on the CPU): a QuantizedWeight
    (the float weight stays empty, as quant/apply.py leaves it) or a dense float weight."""
    dtype = module.weight.dtype
    module.packed_weight = None
    if isinstance(weight, torch.Tensor):
        module.weight = nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)
        return
    module.quant = weight.to_(device)
    module.weight = nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)


def checkpoint_loader(method: str | None, hf_config: Any, device: torch.device,
                      model: nn.Module) -> CheckpointLoader | None:
    """The loader of a quantized checkpoint's Linears (None for a float checkpoint), after `check`."""
    if method not in CHECKPOINT_METHODS:
        return None
    from tram.distributed import get_tp

    check(method, device.type, hf_config, get_tp().size)
    return CheckpointLoader(parse_scheme(hf_config), model, device)
