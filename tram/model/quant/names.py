"""The quantization methods Tram runs, by name, importable without torch: the API process reads them
(configuration validates --quantization against them; `tram serve --help` lists them).

  * ON_THE_FLY: made at load from a float checkpoint's weights (apply.py).
  * CHECKPOINT_METHODS: read from a quantized checkpoint, whose config.json's quantization_config
    names its quant_method; one per registered format (formats/, a module each).
"""

from __future__ import annotations

from tram.model.quant.formats import checkpoint_methods

ON_THE_FLY: tuple[str, ...] = ("int8", "int4")
CHECKPOINT_METHODS: tuple[str, ...] = checkpoint_methods()
QUANTIZATION_METHODS: tuple[str, ...] = ON_THE_FLY + CHECKPOINT_METHODS


def is_on_the_fly(method: str | None) -> bool:
    """Whether `method` quantizes a float checkpoint at load (rather than reading a quantized one)."""
    return method in ON_THE_FLY


def reads_checkpoint(method: str | None) -> bool:
    """Whether `method` reads a quantized checkpoint's own weights (a registered format)."""
    return method in CHECKPOINT_METHODS
