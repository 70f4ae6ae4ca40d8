"""Loading a quantized checkpoint's Linears, whatever its format (formats/: GPTQ, AWQ,
compressed-tensors, one module each, picked by config.json's quantization_config; ModelConfig.quantization
carries its quant_method).

`checkpoint_loader` checks the scheme (check.py: the format's `parse` raises ValueError, naming the
scheme and what is supported, for anything Tram cannot run). While loading, a `CheckpointLoader`
takes the quantized Linears' tensors (the suffixes its format consumes: qweight/qzeros/scales/g_idx,
weight_packed/weight_scale/...) out of the stream, and at the end gives each such Linear its `quant`
(the format unpacks them and cuts a rank's slice, unpacked.py repacks them) and an empty float
weight; every other tensor loads as usual.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from tram.model.quant.check import check_checkpoint
from tram.model.quant.checkpoint_shards import full_shape, layer_shard
from tram.model.quant.formats import CheckpointScheme, format_for, parse_scheme
from tram.model.quant.names import CHECKPOINT_METHODS
from tram.model.quant.unpacked import Int4Parts, Parts, int4_weight, unpacked_shape
from tram.model.weight_utils import checkpoint_owner, checkpoint_rename

__all__ = ["CHECKPOINT_METHODS", "CheckpointLoader", "checkpoint_loader"]

logger = logging.getLogger(__name__)


class CheckpointLoader:
    """Takes a quantized checkpoint's per-Linear tensors out of the loading loop, then sets each
    Linear's `quant` from them (`finish`). Contract with loader.load_model: `plan` on the meta-device
    model (it scans the files); then load_safetensors_weights hands every tensor name that `claims`
    to `add`, and counts `finish`'s parameter names as loaded."""

    def __init__(self, scheme: CheckpointScheme, model: nn.Module, device: torch.device | str = "cpu") -> None:
        from tram.model.layers.linear import Linear

        self.scheme = scheme
        self.device = torch.device(device)  # where the built weights go
        self.model = model
        self.modules = dict(model.named_modules())
        self.linears = {name: m for name, m in self.modules.items() if isinstance(m, Linear)}
        self.expert_layers: dict[str, nn.Module] = {}  # MoE layers that got quantized experts
        self.suffixes = set(scheme.format.tensors)
        self.quantized: set[str] = set()  # module names whose tensors are quantized
        self.parts: dict[str, Parts] = {}

    def scan(self, names: list[str]) -> None:
        """Learn which Linears are quantized from the checkpoint's tensor names (before loading:
        compressed-tensors' int8 `weight` sorts before the `weight_scale` that marks it)."""
        marker = "." + self.scheme.format.marker
        names = [checkpoint_rename(self.model, name) for name in names]
        self.quantized.update(name[: -len(marker)] for name in names if name.endswith(marker))

    def plan(self, files: list[str]) -> None:
        """On the meta-device model, before it is materialised: `scan` the files, and drop the float
        weight of every quantized Linear, so that no device ever allocates the float model."""
        from safetensors import safe_open

        for file in files:
            with safe_open(file, framework="pt", device="cpu") as f:
                self.scan(list(f.keys()))
        for prefix in self.quantized:
            module = self.linears.get(prefix)
            owner = None if module is not None else checkpoint_owner(self.modules, prefix + ".weight")
            if owner is not None and hasattr(owner[1], "drop_float_experts"):
                owner[1].drop_float_experts()
            if module is not None and module.weight.is_meta:
                module.weight = nn.Parameter(
                    torch.empty(0, dtype=module.weight.dtype, device="meta"), requires_grad=False
                )

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
                self._add_expert(prefix, self.parts.pop(prefix))
                continue
            weight = self._build(prefix, self.parts.pop(prefix))
            _install(module, weight, self.device)
            if isinstance(weight, torch.Tensor):
                dense.append(prefix)
            filled.add(prefix + ".weight")
        if dense:
            logger.warning(
                "%d quantized layers have shapes the int4 kernel cannot take and run dequantized: %s",
                len(dense),
                ", ".join(dense[:5]) + (" ..." if len(dense) > 5 else ""),
            )
        for prefix, layer in self.expert_layers.items():
            filled |= {f"{prefix}.{name}" for name in layer.finish_quantized_experts()}
        logger.info("Read %d %s-quantized linear layers", len(filled), self.scheme.method)
        return filled

    def _add_expert(self, prefix: str, parts: Parts) -> None:
        """One expert projection of an MoE layer (`...experts.3.gate_proj`), unpacked and cut to this rank."""
        owner = checkpoint_owner(self.modules, prefix + ".weight")
        if owner is None or not hasattr(owner[1], "quantized_expert_slot"):
            raise ValueError(f"Checkpoint has quantized tensors for {prefix}, which is no linear layer of the model")
        layer_prefix, layer = owner
        name = prefix[len(layer_prefix) + 1 :]
        slot = layer.quantized_expert_slot(name)
        self.expert_layers[layer_prefix] = layer
        weight = self._unpack(prefix, parts, slot.full_shape)
        if slot.local is None:
            return  # another rank's expert: checked, not kept
        if slot.shard is not None:
            weight = self.scheme.format.shard(weight, slot.shard)
        weight = int4_weight(weight) if isinstance(weight, Int4Parts) else weight
        weight = weight.to(self.device) if isinstance(weight, torch.Tensor) else weight.to_(self.device)
        layer.set_quantized_expert(slot, weight)

    def _unpack(self, prefix: str, parts: Parts, expected: tuple[int, int]) -> Any:
        """The whole layer's unpacked weight, checked against its expected [out, in]."""
        try:
            weight = self.scheme.format.unpack(self.scheme.layer_scheme(prefix), parts)
        except KeyError as err:
            raise ValueError(f"Quantized layer {prefix} lacks its {err.args[0]} tensor") from None
        shape = unpacked_shape(weight)
        if shape != expected:
            raise ValueError(
                f"Quantized layer {prefix} holds a {shape[0]}x{shape[1]} weight, the model expects "
                f"{expected[0]}x{expected[1]}"
            )
        return weight

    def _build(self, prefix: str, parts: Parts) -> Any:  # QuantizedWeight, or a dense float weight
        module = self.linears[prefix]
        # Of the whole layer, whichever slice this rank keeps.
        weight = self._unpack(prefix, parts, full_shape(module))
        shard = layer_shard(module)
        if shard is not None:
            weight = self.scheme.format.shard(weight, shard)
        return int4_weight(weight) if isinstance(weight, Int4Parts) else weight


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


def checkpoint_loader(
    method: str | None, hf_config: Any, device: torch.device, model: nn.Module
) -> CheckpointLoader | None:
    """The loader of a quantized checkpoint's Linears (None for a float checkpoint), after
    `check_checkpoint`."""
    if format_for(method) is None:
        return None
    from tram.distributed import get_tp

    check_checkpoint(method, device.type, hf_config, get_tp().size)
    return CheckpointLoader(parse_scheme(hf_config), model, device)
