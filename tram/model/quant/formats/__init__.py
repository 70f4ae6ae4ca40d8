"""Checkpoint quantization formats, one module each, registered by the quant_method names that
config.json's quantization_config gives them (registry.py). Adding a format is adding a module that
subclasses `CheckpointFormat` under `@register`, and importing it below. Torch-free at import.
"""

from tram.model.quant.formats.base import CheckpointFormat, CheckpointScheme, LayerScheme
from tram.model.quant.formats.registry import (
    checkpoint_methods,
    format_for,
    format_names,
    parse_scheme,
    register,
    unsupported,
)

# Each import registers its format; the order is the order error messages name them in.
from tram.model.quant.formats import gptq, awq, compressed_tensors, mxfp4  # noqa: E402, F401, I001  isort: skip

__all__ = [
    "CheckpointFormat",
    "CheckpointScheme",
    "LayerScheme",
    "checkpoint_methods",
    "format_for",
    "format_names",
    "parse_scheme",
    "register",
    "unsupported",
]
