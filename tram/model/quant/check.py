"""Whether Tram can run a quantization here: checked when the engine is configured and again at load,
raising ValueError that names what is supported. Imports no torch (the API process validates with
it); a compressed-tensors checkpoint's config is read with that package, which does."""

from __future__ import annotations

from typing import Any

from tram.model.quant.formats import format_names, parse_scheme
from tram.model.quant.names import CHECKPOINT_METHODS, ON_THE_FLY

DEVICE_TYPES = ("cpu", "cuda")  # where the quantized kernels run (C++ on CPU, Triton on CUDA)


def check_quantization(
    method: str | None, device_type: str, hf_config: Any = None, tensor_parallel_size: int = 1
) -> None:
    """ValueError, naming what is supported, for a method Tram cannot run here. A quantized
    checkpoint's method is checked against its config (`hf_config`) where given."""
    if method is None:
        return
    if method in CHECKPOINT_METHODS:
        check_checkpoint(method, device_type, hf_config, tensor_parallel_size)
        return
    if method not in ON_THE_FLY:
        raise ValueError(
            f"quantization {method!r} is not supported: choose {' or '.join(ON_THE_FLY)} "
            f"(weight-only, made from a float checkpoint at load), or serve a {format_names()} "
            "checkpoint (its config.json's quantization_config selects it)"
        )
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"quantization {method!r} runs on CPU and CUDA devices, not {device_type!r}")


def check_checkpoint(method: str, device_type: str, hf_config: Any = None, tensor_parallel_size: int = 1) -> None:
    """ValueError at start for a quantized checkpoint Tram cannot run here: its scheme (parsed by
    its format) where `hf_config` is given. Any tensor_parallel_size is fine: every scheme that a
    format accepts splits over ranks (checkpoint_shards.py)."""
    if device_type not in DEVICE_TYPES:
        raise ValueError(
            f"quantization {method!r} (a quantized checkpoint) runs on CPU and CUDA devices, not {device_type!r}"
        )
    if hf_config is not None:
        scheme = parse_scheme(hf_config)
        if scheme.method != method:
            raise ValueError(f"quantization {method!r} does not match the checkpoint's quant_method {scheme.method!r}")
