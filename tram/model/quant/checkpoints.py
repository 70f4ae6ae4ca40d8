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
        self.linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
        self.suffixes = set(scheme.format.tensors)
        self.quantized: set[str] = set()  # module names whose tensors are quantized
        self.parts: dict[str, Parts] = {}

    def scan(self, names: list[str]) -> None:
        """Learn which Linears are quantized from the checkpoint's tensor names (before loading:
        compressed-tensors' int8 `weight` sorts before the `weight_scale` that marks it)."""
        marker = "." + self.scheme.format.marker
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
                raise ValueError(
                    f"Checkpoint has quantized tensors for {prefix}, which is no linear layer of the model"
                )
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
        logger.info("Read %d %s-quantized linear layers", len(filled), self.scheme.method)
        return filled

    def _build(self, prefix: str, parts: Parts) -> Any:  # QuantizedWeight, or a dense float weight
        module = self.linears[prefix]
        fmt = self.scheme.format
        try:
            weight = fmt.unpack(self.scheme.layer_scheme(prefix), parts)
        except KeyError as err:
            raise ValueError(f"Quantized layer {prefix} lacks its {err.args[0]} tensor") from None
        shape = unpacked_shape(weight)
        expected = full_shape(module)  # of the whole layer, whichever slice this rank keeps
        if shape != expected:
            raise ValueError(
                f"Quantized layer {prefix} holds a {shape[0]}x{shape[1]} weight, the model expects "
                f"{expected[0]}x{expected[1]}"
            )
        shard = layer_shard(module)
        if shard is not None:
            weight = fmt.shard(weight, shard)
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
