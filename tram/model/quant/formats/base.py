"""What a quantized checkpoint's format is to Tram: a `CheckpointFormat` (the quant_method names it
claims, the schemes it reads, how it unpacks a Linear's tensors), and the scheme parsed from a
checkpoint's quantization_config (`CheckpointScheme`, one `LayerScheme` per group of Linears).

Importing this (and every format module) needs no torch: the API process reads the registered names
(names.py). A format imports its tensor code when a checkpoint loads (`unpack`, `shard`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tram.model.layers.parallel_linear import Shard
    from tram.model.quant.unpacked import Parts, Unpacked

SchemeGroups = list[tuple[tuple[str, ...], "LayerScheme"]]  # (targets, scheme); () targets every Linear


@dataclass(frozen=True)
class LayerScheme:
    """How one Linear is stored: bits, group size (-1: per channel), symmetric (no zero points).
    Act-order needs no flag: the checkpoint's g_idx tensor, where it has one, gives the order."""

    bits: int = 4
    group_size: int = -1
    symmetric: bool = True


class CheckpointFormat:
    """One checkpoint quantization format, registered by name (registry.register). A subclass says:

      * name: how messages call it (GPTQ); methods: the quant_method names of config.json's
        quantization_config that select it; supported: what of it Tram reads, for error messages.
      * tensors: the suffixes of a quantized Linear's tensors it consumes; marker: the one whose
        presence marks a Linear as quantized.
      * parse(config): its schemes (ValueError, from registry.unsupported, for what Tram cannot run).
      * unpack(scheme, parts): a whole layer's tensors as Int4Parts (to repack) or a QuantizedWeight.
    `shard` (a tensor-parallel rank's slice of an unpacked layer) and `matches` (a group's target)
    have defaults that fit any format whose unpacked weights are Int4Parts or int8 per channel."""

    name: str = ""
    methods: tuple[str, ...] = ()
    supported: str = ""
    tensors: tuple[str, ...] = ()
    marker: str = ""

    def parse(self, config: dict[str, Any]) -> SchemeGroups:
        raise NotImplementedError

    def unpack(self, scheme: LayerScheme, parts: Parts) -> Unpacked:
        raise NotImplementedError

    def shard(self, weight: Unpacked, shard: Shard) -> Unpacked:
        """This rank's slice of a whole layer's unpacked weight."""
        from tram.model.quant.checkpoint_shards import shard_weight  # torch: only when a checkpoint loads

        return shard_weight(weight, shard)

    def matches(self, module_name: str, target: str) -> bool:
        """Whether a scheme group's target names this Linear (a module name, or its tail)."""
        return module_name == target or module_name.endswith("." + target)


@dataclass
class CheckpointScheme:
    """A checkpoint's quantization: its format, and one scheme for every quantized Linear (GPTQ,
    AWQ) or one per config group, picked by the group's targets (compressed-tensors)."""

    method: str
    format: CheckpointFormat
    groups: SchemeGroups = field(default_factory=list)

    def layer_scheme(self, module_name: str) -> LayerScheme:
        if len(self.groups) == 1:
            return self.groups[0][1]
        for targets, scheme in self.groups:
            if any(self.format.matches(module_name, t) for t in targets):
                return scheme
        raise ValueError(f"no quantization_config group targets the quantized layer {module_name}")
