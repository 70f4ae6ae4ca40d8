"""MXFP4 checkpoints (gpt-oss as OpenAI released it): only the MoE experts are quantized, stacked
as `<projection>_blocks` and `<projection>_scales`, which the experts layer dequantizes at load
(layers/moe/stacked.py); every Linear is float, so this format claims no Linear's tensors."""

from __future__ import annotations

from typing import Any

from tram.model.quant.formats.base import CheckpointFormat, SchemeGroups
from tram.model.quant.formats.registry import register


@register
class MXFP4(CheckpointFormat):
    name = "MXFP4"
    methods = ("mxfp4",)
    supported = "MXFP4 experts (gpt-oss), dequantized at load"
    tensors = ()
    marker = "\0"  # no tensor name ends in it: no Linear is quantized

    def parse(self, config: dict[str, Any]) -> SchemeGroups:
        return []
